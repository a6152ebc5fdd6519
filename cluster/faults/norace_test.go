//go:build !race

package faults

// raceEnabled: the test binary runs under the race detector, and so do
// the nodes it builds.
const raceEnabled = false
