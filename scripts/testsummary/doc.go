// Command testsummary prints the JSON events of go test -json as go test
// prints its results without -json, then says which tests were skipped and
// why, so that no suite is skipped silently:
//
//	go test -race -json ./... | go run -race ./scripts/testsummary
//
// It prints, as each package finishes, the line go test prints for it ("ok",
// "FAIL", or "no test files") and, for a package that failed, the output of
// every test that failed (or never finished) in full, with the build errors
// of a package that did not build. At the end it prints one line per
// skipped suite (the skipped tests of a package that gave the same reason,
// with that reason: the last thing the test logged, t.Skip's message), and
// a total.
//
// It exits 1 if a package failed, did not build or never finished (go test
// stopped), or if its input held no package at all, so that the pipeline's
// status is the tests' status even without the shell's pipefail. Lines of
// its input that are not JSON events are copied to its output.
//
// go test -json runs the tests as go test -v does: testing.Verbose reports
// true and every log line is kept, but only those of failed tests are
// printed here.
package main
