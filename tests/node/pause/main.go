// Command pause is the sandbox process of the tests' node, and the program of the image the node
// tests run: it holds a Pod's namespaces open, reaps the zombies it inherits as PID 1, and exits
// 0 on SIGTERM or SIGINT. Built static (CGO_ENABLED=0), so the image needs no libc.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reap()
	}
}

// reap waits for every exited child without blocking.
func reap() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}
