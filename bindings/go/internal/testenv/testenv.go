// Package testenv gives the examples' tests their store: the real server the test command
// started and named in an environment variable, else a file store in a temp dir.
package testenv

import (
	"os"
	"testing"
)

// URL is the store URL in the variable named v (LEASEHOLD_TEST_REDIS, LEASEHOLD_TEST_K8S …).
// When it is unset: with LEASEHOLD_TEST_REQUIRE_ALL=1 (the test command sets it) the test
// fails, else a file store in a temp dir stands in.
func URL(t *testing.T, v string) string {
	t.Helper()
	if url := os.Getenv(v); url != "" {
		return url
	}
	if os.Getenv("LEASEHOLD_TEST_REQUIRE_ALL") == "1" {
		t.Fatalf("%s is not set: the test command starts that server", v)
	}
	return "file://" + t.TempDir()
}
