package leasehold_test

import (
	"context"
	"fmt"
	"os"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"leasehold.dev/leasehold"
)

// The stores the tests run on: the file store always (in a temp dir), and each real server the
// test command started, named in LEASEHOLD_TEST_* variables. With LEASEHOLD_TEST_REQUIRE_ALL=1
// (set by the test command) a missing one fails the run instead of leaving it out.
var serverVars = map[string]string{
	"redis":    "LEASEHOLD_TEST_REDIS",
	"postgres": "LEASEHOLD_TEST_POSTGRES",
	"etcd":     "LEASEHOLD_TEST_ETCD",
	"k8s":      "LEASEHOLD_TEST_K8S",
	"gcs":      "LEASEHOLD_TEST_GCS",
}

// storeURLs returns the store URLs by name; each call gets a fresh file store.
func storeURLs(t *testing.T) map[string]string {
	t.Helper()
	urls := map[string]string{"file": "file://" + t.TempDir()}
	for name, v := range serverVars {
		url := os.Getenv(v)
		if url == "" {
			if os.Getenv("LEASEHOLD_TEST_REQUIRE_ALL") == "1" {
				t.Fatalf("%s is not set: the test command starts that server", v)
			}
			continue
		}
		urls[name] = url
	}
	return urls
}

// forEachStore runs f as a subtest per store, in a stable order.
func forEachStore(t *testing.T, f func(t *testing.T, url string)) {
	urls := storeURLs(t)
	names := make([]string, 0, len(urls))
	for n := range urls {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		url := urls[n]
		t.Run(n, func(t *testing.T) { f(t, url) })
	}
}

var keySeq int64

// uniqueKey is a key no other test (or earlier run against the same server) uses.
func uniqueKey(t *testing.T) string {
	name := strings.NewReplacer("/", "-", " ", "-").Replace(t.Name())
	return fmt.Sprintf("go-%s-%d-%d", name, time.Now().UnixNano(), atomic.AddInt64(&keySeq, 1))
}

func connect(t *testing.T, url string, opts ...leasehold.Option) *leasehold.Locks {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	locks, err := leasehold.Connect(ctx, url, opts...)
	if err != nil {
		t.Fatalf("connect %s: %v", url, err)
	}
	t.Cleanup(func() { locks.Close() })
	return locks
}

// within is a context that fails the test's waits after d rather than hanging.
func within(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

func mustAcquire(t *testing.T, lk *leasehold.Lock) *leasehold.Lease {
	t.Helper()
	lease, err := lk.Acquire(within(t, 30*time.Second))
	if err != nil {
		t.Fatalf("acquire %s: %v", lk.Key(), err)
	}
	return lease
}

func mustRelease(t *testing.T, lease *leasehold.Lease) {
	t.Helper()
	if err := lease.Release(within(t, 30*time.Second)); err != nil {
		t.Fatalf("release %s: %v", lease.Key(), err)
	}
}
