//go:build !race

package persist

// raceEnabled reports whether the tests run with the race detector.
const raceEnabled = false
