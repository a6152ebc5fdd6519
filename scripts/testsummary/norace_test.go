//go:build !race

package main

// raceEnabled: the test runs under the race detector.
const raceEnabled = false
