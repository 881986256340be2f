// The peer's machines in a testcloud (-cloud URL): vmop's in-memory HTTP cloud
// (tests/src/cloud of vmop), the one vmop's testcloud plugin talks to, so that both operators
// meet the same latency and the same throttling (bench/run.sh --cloud ec2-like).
//
// The reconcile is the kubebuilder way with an external resource:
//
//   - live VM, no id in status: an idempotent create, POST /v1/machines with ifAbsent (the
//     testcloud's client token: a second create of the same uid answers the first machine),
//     then status;
//   - live VM with an id: GET /v1/machines/{id}; a 404 (the machine is gone) creates again;
//   - deleted VM: DELETE /v1/machines/{id} (a 404 is done), or without an id in status,
//     GET /v1/machines?uid= and a DELETE of each; then the finalizer goes.
//
// A 429 (throttled) requeues the VM after the answer's Retry-After (-on-throttle retry-after,
// the default, as vmop's host does), or returns the error to controller-runtime's per-item
// exponential backoff (-on-throttle error). Any other failure is an error (the backoff).
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"
)

type cloudProvider struct {
	base   string
	client *http.Client
	// retryAfter: a 429 requeues after its Retry-After (false: an error, the default backoff).
	retryAfter bool
	// Counts, logged when the peer stops.
	calls, throttled, creates, deletes atomic.Int64
}

func newCloudProvider(base string, retryAfter bool) *cloudProvider {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = 64 // 16 reconciles at once: keep their connections
	return &cloudProvider{
		base:       base,
		client:     &http.Client{Transport: transport, Timeout: 30 * time.Second},
		retryAfter: retryAfter,
	}
}

// throttledError is a 429 and its Retry-After.
type throttledError struct {
	wait time.Duration
	what string
}

func (e *throttledError) Error() string {
	return fmt.Sprintf("%s: throttled (429), retry after %v", e.what, e.wait)
}

type cloudMachine struct {
	ID        string   `json:"id"`
	Addresses []string `json:"addresses"`
}

// call makes one request; a status other than 2xx or 404 is an error (429: throttledError).
// found is false for a 404.
func (c *cloudProvider) call(ctx context.Context, method, path string, body, out any) (found bool, err error) {
	var reader io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return false, err
		}
		reader = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, reader)
	if err != nil {
		return false, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	c.calls.Add(1)
	resp, err := c.client.Do(req)
	if err != nil {
		return false, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return false, err
	}
	what := method + " " + path
	switch {
	case resp.StatusCode == http.StatusTooManyRequests:
		c.throttled.Add(1)
		wait := time.Second
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil && s > 0 {
			wait = time.Duration(s) * time.Second
		}
		return false, &throttledError{wait: wait, what: what}
	case resp.StatusCode == http.StatusNotFound:
		return false, nil
	case resp.StatusCode < 200 || resp.StatusCode > 299:
		return false, fmt.Errorf("%s: HTTP %d: %s", what, resp.StatusCode, bytes.TrimSpace(raw))
	}
	if out != nil {
		if err := json.Unmarshal(raw, out); err != nil {
			return false, fmt.Errorf("%s: %w", what, err)
		}
	}
	return true, nil
}

// ensure answers the VM's machine: the one its status names if it is still there, else a new
// one (an idempotent create by the VM's UID).
func (c *cloudProvider) ensure(ctx context.Context, vm *VirtualMachine) (machine, error) {
	var m cloudMachine
	if id := vm.Status.ID; id != "" {
		found, err := c.call(ctx, http.MethodGet, "/v1/machines/"+url.PathEscape(id), nil, &m)
		if err != nil {
			return machine{}, err
		}
		if found {
			return m.machine(), nil
		}
	}
	mib := int64(0)
	if q, err := resource.ParseQuantity(vm.Spec.Memory.String()); err == nil {
		mib = q.Value() / (1 << 20)
	}
	body := map[string]any{
		"uid":       string(vm.UID),
		"image":     vm.Spec.Image,
		"cpu":       vm.Spec.CPU,
		"memoryMib": mib,
		"ifAbsent":  true,
	}
	if vm.Spec.UserData != nil {
		body["userData"] = *vm.Spec.UserData
	}
	found, err := c.call(ctx, http.MethodPost, "/v1/machines", body, &m)
	if err != nil {
		return machine{}, err
	}
	if !found {
		return machine{}, errors.New("POST /v1/machines: HTTP 404")
	}
	c.creates.Add(1)
	return m.machine(), nil
}

// remove deletes the VM's machine: by the id in its status, or each machine of its UID.
func (c *cloudProvider) remove(ctx context.Context, vm *VirtualMachine) error {
	ids := []string{vm.Status.ID}
	if vm.Status.ID == "" {
		var list struct {
			Machines []cloudMachine `json:"machines"`
		}
		if _, err := c.call(ctx, http.MethodGet, "/v1/machines?uid="+url.QueryEscape(string(vm.UID)), nil, &list); err != nil {
			return err
		}
		ids = ids[:0]
		for _, m := range list.Machines {
			ids = append(ids, m.ID)
		}
	}
	for _, id := range ids {
		if _, err := c.call(ctx, http.MethodDelete, "/v1/machines/"+url.PathEscape(id), nil, nil); err != nil {
			return err
		}
		c.deletes.Add(1)
	}
	return nil
}

func (m cloudMachine) machine() machine {
	made := machine{id: m.ID}
	if len(m.Addresses) > 0 {
		made.address = m.Addresses[0]
	}
	return made
}

// reconcileCloud is Reconcile with the machines in the testcloud.
func (r *VirtualMachineReconciler) reconcileCloud(ctx context.Context, vm *VirtualMachine) (ctrl.Result, error) {
	if !vm.DeletionTimestamp.IsZero() {
		if controllerutil.ContainsFinalizer(vm, finalizer) {
			if vm.Spec.DeletionPolicy != "Orphan" {
				if err := r.Cloud.remove(ctx, vm); err != nil {
					return r.Cloud.failed(err)
				}
			}
			controllerutil.RemoveFinalizer(vm, finalizer)
			if err := r.Update(ctx, vm); err != nil {
				return ctrl.Result{}, err
			}
		}
		return ctrl.Result{}, nil
	}
	if err := r.addFinalizer(ctx, vm); err != nil {
		return ctrl.Result{}, err
	}
	made, err := r.Cloud.ensure(ctx, vm)
	if err != nil {
		return r.Cloud.failed(err)
	}
	return ctrl.Result{}, r.setStatus(ctx, vm, made)
}

// failed is the result of a failed cloud call: a requeue after Retry-After for a 429 (with
// -on-throttle retry-after), else the error.
func (c *cloudProvider) failed(err error) (ctrl.Result, error) {
	var throttled *throttledError
	if c.retryAfter && errors.As(err, &throttled) {
		return ctrl.Result{RequeueAfter: throttled.wait}, nil
	}
	return ctrl.Result{}, err
}
