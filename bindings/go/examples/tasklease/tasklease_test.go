package tasklease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"leasehold.dev/leasehold/examples/tasklease"
	"leasehold.dev/leasehold/internal/testenv"
)

// Two pods, four goroutines each, reconciling one task over and over: never two inside at once,
// fences rising, and a busy task requeued rather than failed.
func TestOneReconcilePerTaskAcrossPodsAndGoroutines(t *testing.T) {
	url := testenv.URL(t, "LEASEHOLD_TEST_K8S")
	ctx := context.Background()
	task := fmt.Sprintf("task-%d", time.Now().UnixNano())
	var inside, ran, requeued int64
	var mu sync.Mutex
	var last uint64
	var wg sync.WaitGroup
	for p := 0; p < 2; p++ {
		t.Setenv("POD_NAME", fmt.Sprintf("controller-%d", p))
		sm, err := tasklease.NewStateMachine(ctx, url, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer sm.Close()
		for g := 0; g < 4; g++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := 0; i < 10; i++ {
					res, err := sm.Reconcile(ctx, task, func(ctx context.Context, fence uint64) error {
						if atomic.AddInt64(&inside, 1) != 1 {
							t.Error("two reconciles of one task at once")
						}
						mu.Lock()
						if fence <= last {
							t.Errorf("fence %d after %d", fence, last)
						}
						last = fence
						mu.Unlock()
						time.Sleep(time.Millisecond) // the reconcile's work
						atomic.AddInt64(&inside, -1)
						atomic.AddInt64(&ran, 1)
						return nil
					})
					if err != nil {
						t.Error(err)
					}
					if res.Requeue {
						atomic.AddInt64(&requeued, 1)
					}
				}
			}()
		}
	}
	wg.Wait()
	if ran == 0 || ran+requeued != 80 {
		t.Fatalf("%d ran, %d requeued of 80", ran, requeued)
	}
}
