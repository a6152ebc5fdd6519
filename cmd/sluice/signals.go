package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// signalContext returns a context that the first SIGINT or SIGTERM cancels,
// with a *signalError as its cause. A second signal writes one line to
// stderr and calls exit(128+signal) at once, without waiting for the
// graceful shutdown the first one started. stop stops listening.
func signalContext(parent context.Context, stderr io.Writer, exit func(int)) (ctx context.Context, stop func()) {
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, os.Interrupt, syscall.SIGTERM)
	ctx, stopWatch := watchSignals(parent, sigs, stderr, exit)
	return ctx, func() {
		signal.Stop(sigs)
		stopWatch()
	}
}

// watchSignals implements signalContext on a channel of signals.
func watchSignals(parent context.Context, sigs <-chan os.Signal, stderr io.Writer, exit func(int)) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case sig := <-sigs:
			cancel(&signalError{sig})
		case <-done:
			return
		}
		select {
		case sig := <-sigs:
			fmt.Fprintf(stderr, "sluice: second %s: exiting without finishing the shutdown\n", signalName(sig))
			exit(signalExitCode(sig))
		case <-done:
		}
	}()
	var once sync.Once
	return ctx, func() {
		once.Do(func() {
			close(done)
			wg.Wait()
			cancel(nil)
		})
	}
}

// signalError is the cause of a context cancelled by a signal.
type signalError struct{ sig os.Signal }

func (e *signalError) Error() string { return "received " + signalName(e.sig) }

func signalName(sig os.Signal) string {
	switch sig {
	case os.Interrupt:
		return "SIGINT"
	case syscall.SIGTERM:
		return "SIGTERM"
	}
	return sig.String()
}

// signalExitCode is the shell's convention for a process ended by sig:
// 128 + its number (130 for SIGINT, 143 for SIGTERM).
func signalExitCode(sig os.Signal) int {
	if s, ok := sig.(syscall.Signal); ok {
		return 128 + int(s)
	}
	return 1
}
