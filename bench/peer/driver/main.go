// Command driver is the bench client, the same for every operator measured: it starts the
// operator given after `--` (every `{ns}` in its arguments becomes the run's namespace), warms
// it up with one VM, then measures three phases on N VirtualMachines in a fresh namespace:
//
//	create: first create -> all Ready (seen by an informer);  W workers create concurrently
//	idle:   a fixed wait with the N VMs in place
//	delete: one deletecollection -> all gone
//
// With -floor there is no operator: each creating worker writes the VM's status itself (one
// update of the status subresource with what an operator would write: id, phase, Ready=True),
// and the VMs carry no finalizer, so the run measures the bare client's floor, the least the
// API server can do for the same N: one create, one status write, one deletecollection.
//
// For each phase: wall time, API write requests from the apiserver's apiserver_request_total
// (POST/PUT/PATCH/APPLY/DELETE, leases excluded, by verb and resource), the operator's CPU
// seconds (utime+stime) and peak RSS (VmHWM, reset at the phase start through clear_refs), both
// summed over the operator process and its live descendants (K replicas under replicas.sh),
// and the CPU seconds of the extra processes named with -watch (kube-apiserver, etcd).
// With -cloud URL (a testcloud), also the cloud's counters over the phase (GET URL/v1/stats
// before and after: calls by class, 429s by class), and the create and delete phases start
// with the cloud's throttling buckets full (POST URL/v1/limits/refill).
// One JSON object per run is appended to -out.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
)

var gvr = schema.GroupVersionResource{Group: "vmop.dev", Version: "v1alpha1", Resource: "virtualmachines"}

type watchFlag map[string]int

func (w watchFlag) String() string { return fmt.Sprint(map[string]int(w)) }
func (w watchFlag) Set(v string) error {
	name, pid, ok := strings.Cut(v, "=")
	n, err := strconv.Atoi(pid)
	if !ok || err != nil {
		return fmt.Errorf("want NAME=PID, got %q", v)
	}
	w[name] = n
	return nil
}

func main() {
	kubeconfig := flag.String("kubeconfig", os.Getenv("KUBECONFIG"), "kubeconfig of the control plane")
	namespace := flag.String("namespace", "", "namespace of the run (created; must not hold VMs)")
	n := flag.Int("n", 200, "VirtualMachines")
	workers := flag.Int("workers", 16, "concurrent creating clients")
	provider := flag.String("provider", "bench", "spec.providerConfigRef.name of the VMs")
	idle := flag.Duration("idle", 60*time.Second, "idle phase")
	deadline := flag.Duration("deadline", 15*time.Minute, "deadline of each phase")
	label := flag.String("label", "", "name of the run in the output")
	out := flag.String("out", "", "append the run's JSON to this file")
	logPath := flag.String("log", "/dev/null", "the operator's stdout and stderr")
	doDelete := flag.Bool("delete", true, "run the delete phase (false: leave the VMs)")
	floor := flag.Bool("floor", false, "no operator: the creating workers write each VM's status themselves (the bare-client floor)")
	pprofDir := flag.String("pprof", "", "write kube-apiserver CPU profiles of the create and delete phases into this directory")
	watch := watchFlag{}
	flag.Var(watch, "watch", "NAME=PID of another process whose CPU to record per phase (repeatable)")
	flag.StringVar(&cloudURL, "cloud", "", "a testcloud's URL: record its /v1/stats per phase, refill its buckets at the create and delete phases' start")
	flag.Parse()
	if *namespace == "" || (flag.NArg() == 0) != *floor {
		fail(fmt.Errorf("usage: driver -namespace NS [flags] -- OPERATOR ARGS... ({ns} is replaced), or driver -floor -namespace NS [flags]"))
	}

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	check(err)
	cfg.QPS = -1 // no client-side rate limit: the driver must not be the bottleneck
	cfg.UserAgent = "vmop-bench-driver"
	dyn := dynamic.NewForConfigOrDie(cfg)
	kube := kubernetes.NewForConfigOrDie(cfg)
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: *namespace}}
	if _, err := kube.CoreV1().Namespaces().Create(ctx, ns, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		fail(err)
	}
	vms := dyn.Resource(gvr).Namespace(*namespace)

	tr := startTracker(dyn, *namespace)

	// The operator (none with -floor: pid 0 has no /proc entry, so its CPU and memory read 0).
	args := make([]string, 0, flag.NArg())
	for _, a := range flag.Args() {
		args = append(args, strings.ReplaceAll(a, "{ns}", *namespace))
	}
	started := time.Now()
	pid := 0
	exited := make(chan error, 1) // never written with -floor
	stop := func() {}
	if !*floor {
		logFile, err := os.Create(*logPath)
		check(err)
		op := exec.Command(args[0], args[1:]...)
		op.Stdout, op.Stderr = logFile, logFile
		op.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		check(op.Start())
		pid = op.Process.Pid
		go func() { exited <- op.Wait() }()
		var stopOnce sync.Once
		stop = func() {
			stopOnce.Do(func() {
				_ = op.Process.Signal(syscall.SIGTERM)
				select {
				case <-exited:
				case <-time.After(30 * time.Second):
					_ = op.Process.Kill()
					<-exited
				}
			})
		}
	}
	defer stop()
	create := func(name string) error {
		if !*floor {
			return vmCreate(ctx, vms, name, *provider)
		}
		return floorCreate(ctx, vms, name, *provider)
	}

	// Warm-up: one VM through its whole life proves the operator is up (caches filled, plugin
	// loaded) and runs every code path once before anything is measured.
	check(create("warmup"))
	check(tr.wait(3*time.Minute, func(ready, _ int) bool { return ready == 1 }, exited))
	warmup := time.Since(started).Seconds()
	keep := 0 // VMs left in place by the warm-up
	if *doDelete {
		check(vms.Delete(ctx, "warmup", metav1.DeleteOptions{}))
		check(tr.wait(3*time.Minute, func(_, present int) bool { return present == 0 }, exited))
	} else {
		keep = 1
	}
	time.Sleep(3 * time.Second) // let debounced writes (vmop's ProviderConfig vmCount) land
	startHWM, _ := treeMem(pid)

	res := Result{Label: *label, N: *n, Workers: *workers, Args: args, Floor: *floor, WarmupSeconds: warmup,
		StartupPeakMiB: kib(startHWM)}

	// create
	prof := startProfiler(kube, *pprofDir, strings.ReplaceAll(*label, " ", "_")+"-create")
	cloudRefill()
	p := begin(ctx, kube, pid, watch)
	jobs := make(chan int)
	var wg sync.WaitGroup
	var posted time.Time
	var postMu sync.Mutex
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				name := fmt.Sprintf("vm-%d", i)
				for attempt := 0; ; attempt++ {
					err := create(name)
					if err == nil || apierrors.IsAlreadyExists(err) {
						break
					}
					if attempt > 20 {
						fail(err)
					}
					postMu.Lock()
					res.CreateRetries++
					postMu.Unlock()
					time.Sleep(100 * time.Millisecond)
				}
			}
			postMu.Lock()
			posted = time.Now()
			postMu.Unlock()
		}()
	}
	go func() {
		for i := 0; i < *n; i++ {
			jobs <- i
		}
		close(jobs)
	}()
	err = tr.wait(*deadline, func(ready, _ int) bool { return ready == *n+keep }, exited)
	wg.Wait()
	res.Create = p.end(ctx, kube, *n)
	prof.stop()
	res.PostSeconds = posted.Sub(p.t0).Seconds()
	if err != nil {
		res.Create.Error = err.Error()
		report(&res, *out)
		fail(err)
	}

	// idle
	p = begin(ctx, kube, pid, watch)
	time.Sleep(*idle)
	res.Idle = p.end(ctx, kube, *n)

	if !*doDelete {
		stop()
		report(&res, *out)
		return
	}

	// delete
	prof = startProfiler(kube, *pprofDir, strings.ReplaceAll(*label, " ", "_")+"-delete")
	cloudRefill()
	p = begin(ctx, kube, pid, watch)
	for attempt := 0; ; attempt++ {
		err := vms.DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{})
		if err == nil {
			break
		}
		if attempt > 5 {
			fail(err)
		}
		fmt.Fprintf(os.Stderr, "deletecollection: %v; again\n", err)
	}
	err = tr.wait(*deadline, func(_, present int) bool { return present == 0 }, exited)
	res.Delete = p.end(ctx, kube, *n)
	prof.stop()
	if err != nil {
		res.Delete.Error = err.Error()
	}
	stop()
	report(&res, *out)
	if err != nil {
		fail(err)
	}
}

func vmCreate(ctx context.Context, vms dynamic.ResourceInterface, name, provider string) error {
	_, err := vmPost(ctx, vms, name, provider)
	return err
}

func vmPost(ctx context.Context, vms dynamic.ResourceInterface, name, provider string) (*unstructured.Unstructured, error) {
	vm := &unstructured.Unstructured{Object: map[string]interface{}{
		"apiVersion": "vmop.dev/v1alpha1",
		"kind":       "VirtualMachine",
		"metadata":   map[string]interface{}{"name": name},
		"spec": map[string]interface{}{
			"providerConfigRef": map[string]interface{}{"name": provider},
			"image":             "ami-12c6146b",
			"cpu":               int64(1),
			"memory":            "512Mi",
			"deletionPolicy":    "Delete",
		},
	}}
	return vms.Create(ctx, vm, metav1.CreateOptions{})
}

// floorCreate creates the VM and writes its status the way an operator would once the machine
// runs: one update of the status subresource on the object the create returned. A create that
// found the VM already there (a retried POST) reads it first.
func floorCreate(ctx context.Context, vms dynamic.ResourceInterface, name, provider string) error {
	vm, err := vmPost(ctx, vms, name, provider)
	if apierrors.IsAlreadyExists(err) {
		vm, err = vms.Get(ctx, name, metav1.GetOptions{})
	}
	for attempt := 0; ; attempt++ {
		if err != nil {
			return err
		}
		if isReady(vm) {
			return nil
		}
		gen := vm.GetGeneration()
		now := metav1.Now().UTC().Format(time.RFC3339)
		vm.Object["status"] = map[string]interface{}{
			"id":                 "vm-" + string(vm.GetUID()),
			"phase":              "Running",
			"observedGeneration": gen,
			"conditions": []interface{}{map[string]interface{}{
				"type": "Ready", "status": "True", "reason": "Running",
				"message":            "the external machine is running",
				"lastTransitionTime": now, "observedGeneration": gen,
			}},
		}
		_, err = vms.UpdateStatus(ctx, vm, metav1.UpdateOptions{})
		if err == nil || !apierrors.IsConflict(err) || attempt > 5 {
			return err
		}
		vm, err = vms.Get(ctx, name, metav1.GetOptions{})
	}
}

// ---- what the informer sees ----

type tracker struct {
	mu             sync.Mutex
	ready, present map[string]bool
	changed        chan struct{}
}

func startTracker(dyn dynamic.Interface, ns string) *tracker {
	tr := &tracker{ready: map[string]bool{}, present: map[string]bool{}, changed: make(chan struct{}, 1)}
	factory := dynamicinformer.NewFilteredDynamicSharedInformerFactory(dyn, 0, ns, nil)
	inf := factory.ForResource(gvr).Informer()
	_, err := inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    tr.upsert,
		UpdateFunc: func(_, obj interface{}) { tr.upsert(obj) },
		DeleteFunc: tr.remove,
	})
	check(err)
	factory.Start(make(chan struct{}))
	if !cache.WaitForCacheSync(make(chan struct{}), inf.HasSynced) {
		fail(fmt.Errorf("the VM informer did not sync"))
	}
	return tr
}

func isReady(u *unstructured.Unstructured) bool {
	conditions, _, _ := unstructured.NestedSlice(u.Object, "status", "conditions")
	for _, c := range conditions {
		m, _ := c.(map[string]interface{})
		if m["type"] == "Ready" && m["status"] == "True" {
			return true
		}
	}
	return false
}

func (t *tracker) upsert(obj interface{}) {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return
	}
	t.mu.Lock()
	t.present[u.GetName()] = true
	if isReady(u) {
		t.ready[u.GetName()] = true
	} else {
		delete(t.ready, u.GetName())
	}
	t.mu.Unlock()
	t.notify()
}

func (t *tracker) remove(obj interface{}) {
	key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj)
	if err != nil {
		return
	}
	_, name, _ := cache.SplitMetaNamespaceKey(key)
	t.mu.Lock()
	delete(t.present, name)
	delete(t.ready, name)
	t.mu.Unlock()
	t.notify()
}

func (t *tracker) notify() {
	select {
	case t.changed <- struct{}{}:
	default:
	}
}

// wait returns once done(ready, present) holds, or fails at the deadline or if the operator exits.
func (t *tracker) wait(deadline time.Duration, done func(ready, present int) bool, exited chan error) error {
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		t.mu.Lock()
		r, p := len(t.ready), len(t.present)
		t.mu.Unlock()
		if done(r, p) {
			return nil
		}
		select {
		case <-t.changed:
		case <-timer.C:
			return fmt.Errorf("deadline %v passed with %d ready, %d present", deadline, r, p)
		case err := <-exited:
			exited <- err
			return fmt.Errorf("the operator exited: %v", err)
		}
	}
}

// ---- one phase's figures ----

type Phase struct {
	Seconds float64        `json:"seconds"`
	Writes  map[string]int `json:"writes"` // "VERB resource[/subresource]"
	// Reads (GET, LIST, and WATCH requests that ended in the phase), the same keys: what an
	// operator asks the API server besides its writes.
	Reads       map[string]int `json:"reads"`
	WritesTotal int            `json:"writesTotal"`
	WritesPerVM float64        `json:"writesPerVM"`
	// The driver's own writes (N creates, one deletecollection) left out:
	OperatorWrites      int                `json:"operatorWrites"`
	OperatorWritesPerVM float64            `json:"operatorWritesPerVM"`
	Conflicts           int                `json:"conflicts"` // writes answered 409
	CPUSeconds          float64            `json:"cpuSeconds"`
	PeakRSSMiB          float64            `json:"peakRssMiB"`
	EndRSSMiB           float64            `json:"endRssMiB"`
	Watched             map[string]float64 `json:"watchedCpuSeconds"`
	// CPU time the hypervisor gave to others while this machine's vCPUs wanted it (/proc/stat
	// steal, all CPUs): a run with much of it measured a busier host, not a slower operator.
	StealSeconds float64 `json:"stealSeconds"`
	// With -cloud: the change of each of the testcloud's /v1/stats counters over the phase
	// (reads, mutates, throttledReads, throttledMutates, throttledByResource, created, ...).
	Cloud map[string]int64 `json:"cloud,omitempty"`
	Error string           `json:"error,omitempty"`
}

type Result struct {
	Label          string   `json:"label"`
	N              int      `json:"n"`
	Workers        int      `json:"workers"`
	Args           []string `json:"args"`
	Floor          bool     `json:"floor,omitempty"`
	WarmupSeconds  float64  `json:"warmupSeconds"`
	StartupPeakMiB float64  `json:"startupPeakRssMiB"`
	PostSeconds    float64  `json:"postSeconds"`
	CreateRetries  int      `json:"createRetries"`
	Create         Phase    `json:"create"`
	Idle           Phase    `json:"idle"`
	Delete         Phase    `json:"delete"`
}

type phaseStart struct {
	t0      time.Time
	pid     int
	metrics map[reqKey]float64
	cpu     float64
	watch   watchFlag
	watched map[string]float64
	steal   float64
	cloud   map[string]int64 // nil without -cloud
}

func begin(ctx context.Context, kube kubernetes.Interface, pid int, watch watchFlag) *phaseStart {
	m, err := scrape(ctx, kube)
	check(err)
	for _, tp := range tree(pid) {
		_ = os.WriteFile(fmt.Sprintf("/proc/%d/clear_refs", tp), []byte("5"), 0) // resets VmHWM
	}
	p := &phaseStart{pid: pid, metrics: m, cpu: treeCPU(pid), watch: watch, watched: map[string]float64{}, steal: hostSteal()}
	for name, wp := range watch {
		p.watched[name] = procCPU(wp)
	}
	p.cloud = cloudStats()
	p.t0 = time.Now()
	return p
}

func (p *phaseStart) end(ctx context.Context, kube kubernetes.Interface, n int) Phase {
	seconds := time.Since(p.t0).Seconds()
	cpu := treeCPU(p.pid) - p.cpu
	hwm, rss := treeMem(p.pid)
	watched := map[string]float64{}
	for name, wp := range p.watch {
		watched[name] = round(procCPU(wp)-p.watched[name], 2)
	}
	var cloud map[string]int64
	if p.cloud != nil {
		cloud = map[string]int64{}
		for k, v := range cloudStats() {
			cloud[k] = v - p.cloud[k]
		}
	}
	m, err := scrape(ctx, kube)
	check(err)
	ph := Phase{Cloud: cloud, Seconds: round(seconds, 3), Writes: map[string]int{}, Reads: map[string]int{},
		CPUSeconds: round(cpu, 2), PeakRSSMiB: kib(hwm), EndRSSMiB: kib(rss), Watched: watched,
		StealSeconds: round(hostSteal()-p.steal, 2)}
	for k, v := range m {
		d := int(v - p.metrics[k] + 0.5)
		if d <= 0 || k.resource == "leases" || k.resource == "" { // "": /metrics and the like
			continue
		}
		verb := k.verb
		if verb == "DELETE" && k.scope != "resource" {
			verb = "DELETECOLLECTION" // reported as DELETE with a namespace or cluster scope
		}
		key := verb + " " + k.resource
		if k.subresource != "" {
			key += "/" + k.subresource
		}
		switch verb {
		case "POST", "PUT", "PATCH", "APPLY", "DELETE", "DELETECOLLECTION":
			ph.Writes[key] += d
			ph.WritesTotal += d
			if key != "POST virtualmachines" && key != "DELETECOLLECTION virtualmachines" {
				ph.OperatorWrites += d // not the driver's own creates and deletecollection
			}
			if k.code == "409" {
				ph.Conflicts += d
			}
		case "GET", "LIST", "WATCH":
			ph.Reads[key] += d
		}
	}
	ph.WritesPerVM = round(float64(ph.WritesTotal)/float64(n), 2)
	ph.OperatorWritesPerVM = round(float64(ph.OperatorWrites)/float64(n), 2)
	return ph
}

// cloudURL is -cloud: a testcloud whose counters each phase records ("": none).
var cloudURL string

// cloudStats is the testcloud's GET /v1/stats (its integer counters), or nil without -cloud.
func cloudStats() map[string]int64 {
	if cloudURL == "" {
		return nil
	}
	resp, err := http.Get(cloudURL + "/v1/stats")
	check(err)
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	check(err)
	if resp.StatusCode != http.StatusOK {
		fail(fmt.Errorf("GET %s/v1/stats: HTTP %d: %s", cloudURL, resp.StatusCode, raw))
	}
	out := map[string]int64{}
	check(json.Unmarshal(raw, &out))
	return out
}

// cloudRefill fills the testcloud's throttling buckets (nothing without -cloud), so that a
// phase starts as the bucket-limited floor assumes (bench/README.md).
func cloudRefill() {
	if cloudURL == "" {
		return
	}
	resp, err := http.Post(cloudURL+"/v1/limits/refill", "application/json", nil)
	check(err)
	_ = resp.Body.Close()
	if resp.StatusCode != http.StatusNoContent {
		fail(fmt.Errorf("POST %s/v1/limits/refill: HTTP %d", cloudURL, resp.StatusCode))
	}
}

type reqKey struct{ verb, resource, subresource, scope, code string }

// scrape reads apiserver_request_total from the apiserver's /metrics.
func scrape(ctx context.Context, kube kubernetes.Interface) (map[reqKey]float64, error) {
	raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return nil, err
	}
	out := map[reqKey]float64{}
	for _, line := range strings.Split(string(raw), "\n") {
		if !strings.HasPrefix(line, "apiserver_request_total{") {
			continue
		}
		end := strings.LastIndex(line, "} ")
		if end < 0 {
			continue
		}
		labels := map[string]string{}
		for _, kv := range strings.Split(line[len("apiserver_request_total{"):end], ",") {
			k, v, _ := strings.Cut(kv, "=")
			labels[k] = strings.Trim(v, `"`)
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(line[end+2:]), 64)
		if err != nil {
			continue
		}
		out[reqKey{labels["verb"], labels["resource"], labels["subresource"], labels["scope"], labels["code"]}] += v
	}
	return out, nil
}

// procCPU is utime+stime of a process, in seconds (clock ticks of 1/100 s).
func procCPU(pid int) float64 {
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	s := string(raw)
	fields := strings.Fields(s[strings.LastIndex(s, ")")+2:])
	utime, _ := strconv.ParseFloat(fields[11], 64)
	stime, _ := strconv.ParseFloat(fields[12], 64)
	return (utime + stime) / 100
}

// tree is pid and its live descendants (bench/replicas.sh runs K operators as its children), or
// nothing for pid 0.
func tree(pid int) []int {
	if pid <= 0 {
		return nil
	}
	children := map[int][]int{}
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", p))
		if err != nil {
			continue
		}
		s := string(raw)
		fields := strings.Fields(s[strings.LastIndex(s, ")")+2:])
		if len(fields) < 2 {
			continue
		}
		ppid, _ := strconv.Atoi(fields[1])
		children[ppid] = append(children[ppid], p)
	}
	out := []int{pid}
	for i := 0; i < len(out); i++ {
		out = append(out, children[out[i]]...)
	}
	return out
}

// treeCPU is procCPU summed over tree(pid).
func treeCPU(pid int) float64 {
	total := 0.0
	for _, p := range tree(pid) {
		total += procCPU(p)
	}
	return total
}

// treeMem is procMem summed over tree(pid): for K replicas, the sum of their peaks.
func treeMem(pid int) (hwm, rss int64) {
	for _, p := range tree(pid) {
		h, r := procMem(p)
		hwm += h
		rss += r
	}
	return hwm, rss
}

// hostSteal is the steal time of all CPUs since boot, in seconds (the first line of /proc/stat).
func hostSteal() float64 {
	raw, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(raw), "\n")
	fields := strings.Fields(line)
	if len(fields) < 9 || fields[0] != "cpu" {
		return 0
	}
	steal, _ := strconv.ParseFloat(fields[8], 64)
	return steal / 100
}

// procMem is VmHWM and VmRSS of a process, in KiB.
func procMem(pid int) (hwm, rss int64) {
	raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, line := range strings.Split(string(raw), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		v, _ := strconv.ParseInt(f[1], 10, 64)
		switch f[0] {
		case "VmHWM:":
			hwm = v
		case "VmRSS:":
			rss = v
		}
	}
	return hwm, rss
}

func kib(v int64) float64 { return round(float64(v)/1024, 1) }
func round(v float64, d int) float64 {
	p := 1.0
	for i := 0; i < d; i++ {
		p *= 10
	}
	return float64(int64(v*p+0.5)) / p
}

func report(res *Result, out string) {
	b, _ := json.Marshal(res)
	if out != "" {
		f, err := os.OpenFile(out, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o644)
		check(err)
		_, _ = f.Write(append(b, '\n'))
		_ = f.Close()
	}
	line := func(name string, p Phase) {
		keys := make([]string, 0, len(p.Writes))
		for k := range p.Writes {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		parts := make([]string, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, fmt.Sprintf("%s=%d", k, p.Writes[k]))
		}
		fmt.Printf("  %-6s %8.2fs  writes %5d (%.2f/VM; operator %.2f/VM, %d conflicts)  cpu %6.2fs  peak %6.1f MiB  end %6.1f MiB  %v  [%s]%s\n",
			name, p.Seconds, p.WritesTotal, p.WritesPerVM, p.OperatorWritesPerVM, p.Conflicts, p.CPUSeconds, p.PeakRSSMiB, p.EndRSSMiB,
			p.Watched, strings.Join(parts, " "), p.Error)
	}
	fmt.Printf("== %s: N=%d workers=%d warmup %.2fs startup-peak %.1f MiB, creates posted in %.2fs (%d retries)\n",
		res.Label, res.N, res.Workers, res.WarmupSeconds, res.StartupPeakMiB, res.PostSeconds, res.CreateRetries)
	line("create", res.Create)
	line("idle", res.Idle)
	line("delete", res.Delete)
	for _, ph := range []struct {
		name string
		p    Phase
	}{{"create", res.Create}, {"idle", res.Idle}, {"delete", res.Delete}} {
		if c := ph.p.Cloud; c != nil {
			fmt.Printf("  %-6s cloud: %d reads (%d throttled), %d mutations (%d throttled, %d by a resource bucket)\n",
				ph.name, c["reads"], c["throttledReads"], c["mutates"], c["throttledMutates"], c["throttledByResource"])
		}
	}
}

func check(err error) {
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "driver:", err)
	os.Exit(1)
}
