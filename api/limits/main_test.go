package limits

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests if any goroutine (a Watcher's polling
// loop, say) outlives them.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// mustParse parses a test file named "f.yaml" or fails the test.
func mustParse(t testing.TB, yaml string) *Config {
	t.Helper()
	c, err := Parse("f.yaml", []byte(yaml))
	if err != nil {
		t.Fatalf("Parse: %v\n%s", err, yaml)
	}
	return c
}
