package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"k8s.io/client-go/kubernetes"
)

// profiler takes kube-apiserver CPU profiles back to back (net/http/pprof's
// /debug/pprof/profile, 2 s each) from start until stop, as DIR/LABEL-NNN.pb.gz: a profile's
// length is fixed when it is asked for, so a phase of unknown length is covered by a series.
// `go tool pprof -top DIR/LABEL-*.pb.gz` merges them.
type profiler struct {
	cancel context.CancelFunc
	done   sync.WaitGroup
}

func startProfiler(kube kubernetes.Interface, dir, label string) *profiler {
	ctx, cancel := context.WithCancel(context.Background())
	p := &profiler{cancel: cancel}
	if dir == "" {
		return p
	}
	check(os.MkdirAll(dir, 0o755))
	p.done.Add(1)
	go func() {
		defer p.done.Done()
		for i := 0; ctx.Err() == nil; i++ {
			// Not cancelled mid-profile: the server writes the profile only at its end.
			raw, err := kube.CoreV1().RESTClient().Get().AbsPath("/debug/pprof/profile").
				Param("seconds", "2").DoRaw(context.Background())
			if err != nil {
				fmt.Fprintf(os.Stderr, "pprof: %v\n", err)
				return
			}
			check(os.WriteFile(filepath.Join(dir, fmt.Sprintf("%s-%03d.pb.gz", label, i)), raw, 0o644))
		}
	}()
	return p
}

// stop ends the series after the profile in flight.
func (p *profiler) stop() {
	p.cancel()
	p.done.Wait()
}
