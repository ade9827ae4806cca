package lockmanager_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"leasehold.dev/leasehold"
	"leasehold.dev/leasehold/examples/lockmanager"
	"leasehold.dev/leasehold/internal/testenv"
)

func manager(t *testing.T, url, pod string) *lockmanager.DistributedLockManager {
	locks, err := leasehold.Connect(context.Background(), url, leasehold.WithHolder(pod))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { locks.Close() })
	return lockmanager.New(locks, 30*time.Second)
}

func TestTheContract(t *testing.T) {
	url := testenv.URL(t, "LEASEHOLD_TEST_K8S")
	ctx := context.Background()
	pod1, pod2 := manager(t, url, "gateway-1"), manager(t, url, "gateway-2")
	// Fingerprints far past a Lease name's 63 characters, alike in their first 100.
	common := strings.Repeat("sha256:9f86d081884c7d659a2feaa0c55ad015", 3)
	keys := []string{common + "a3bf4f1b2b0b822cd15d6c15b0f00a08", common + "b3bf4f1b2b0b822cd15d6c15b0f00a08"}
	for _, key := range keys {
		if ok, err := pod1.AcquireLock(ctx, key); !ok || err != nil {
			t.Fatalf("pod 1, a free key: (%v, %v)", ok, err)
		}
		if ok, err := pod1.AcquireLock(ctx, key); !ok || err != nil {
			t.Fatalf("pod 1 again (idempotent): (%v, %v)", ok, err)
		}
		if ok, err := pod2.AcquireLock(ctx, key); ok || err != nil {
			t.Fatalf("pod 2 while pod 1 holds it: (%v, %v)", ok, err)
		}
	}
	first := pod1.Fence(keys[0])
	for _, key := range keys {
		if err := pod1.ReleaseLock(ctx, key); err != nil {
			t.Fatal(err)
		}
		if err := pod1.ReleaseLock(ctx, key); err != nil {
			t.Fatalf("a second release: %v", err)
		}
	}
	if ok, err := pod2.AcquireLock(ctx, keys[0]); !ok || err != nil {
		t.Fatalf("pod 2 after pod 1 released: (%v, %v)", ok, err)
	}
	if pod2.Fence(keys[0]) <= first {
		t.Fatalf("fence %d after %d", pod2.Fence(keys[0]), first)
	}
	if err := pod2.ReleaseLock(ctx, keys[0]); err != nil {
		t.Fatal(err)
	}
	// (false, err) for a failure, not (false, nil).
	if ok, err := pod1.AcquireLock(ctx, ""); ok || !errors.Is(err, leasehold.ErrInvalidInput) {
		t.Fatalf("an empty key: (%v, %v)", ok, err)
	}
}

func TestOneHolderAmongManyPods(t *testing.T) {
	url := testenv.URL(t, "LEASEHOLD_TEST_K8S")
	key := fmt.Sprintf("signal-%d", time.Now().UnixNano())
	ctx := context.Background()
	results := make(chan bool, 6)
	for i := 0; i < 6; i++ {
		m := manager(t, url, fmt.Sprintf("pod-%d", i))
		go func() {
			ok, err := m.AcquireLock(ctx, key)
			if err != nil {
				t.Error(err)
			}
			results <- ok
		}()
	}
	won := 0
	for i := 0; i < 6; i++ {
		if <-results {
			won++
		}
	}
	if won != 1 {
		t.Fatalf("%d pods took the lock at once", won)
	}
}
