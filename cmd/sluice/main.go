package main

import (
	"context"
	"os"
)

func main() {
	ctx, stop := signalContext(context.Background(), os.Stderr, os.Exit)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr, os.Getenv)
	stop()
	os.Exit(code)
}
