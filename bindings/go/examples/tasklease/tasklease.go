// Package tasklease runs each task of a controller in at most one place at a time: one
// Kubernetes Lease per task, so that two pods never call the LLM for one task at once, and the
// in-process layer in front of it, so that two goroutines of one pod never do either — without
// a map of mutexes kept by hand.
//
// The holder identity is the pod's name (POD_NAME from the downward API). A task whose lease is
// held elsewhere is requeued politely: contention is not an error.
package tasklease

import (
	"context"
	"fmt"
	"os"
	"time"

	"leasehold.dev/leasehold"
)

// StateMachine reconciles tasks, one lease per task.
type StateMachine struct {
	locks *leasehold.Locks
	ttl   time.Duration
}

// NewStateMachine connects to the store (for example "k8s://?prefix=task-llm-": the pod's
// namespace, Leases named task-llm-<task>) as POD_NAME, with the in-process layer on.
func NewStateMachine(ctx context.Context, storeURL string, ttl time.Duration) (*StateMachine, error) {
	opts := []leasehold.Option{leasehold.WithLocalLayer(true)}
	if pod := os.Getenv("POD_NAME"); pod != "" {
		opts = append(opts, leasehold.WithHolder(pod))
	}
	locks, err := leasehold.Connect(ctx, storeURL, opts...)
	if err != nil {
		return nil, err
	}
	return &StateMachine{locks: locks, ttl: ttl}, nil
}

// Close closes the client.
func (sm *StateMachine) Close() error { return sm.locks.Close() }

// acquireTaskLease takes the task's lease without waiting: (lease, true, nil), or
// (nil, false, nil) when another pod or another goroutine of this pod has it.
func (sm *StateMachine) acquireTaskLease(ctx context.Context, taskName string) (*leasehold.Lease, bool, error) {
	lease, err := sm.locks.Lock(taskName, leasehold.WithTTL(sm.ttl), leasehold.WithLabel("task", taskName)).TryAcquire(ctx)
	if err != nil {
		return nil, false, fmt.Errorf("task %s: %w", taskName, err)
	}
	return lease, lease != nil, nil
}

// Result is what a reconcile did.
type Result struct {
	// Requeue: the task's lease is held elsewhere; try again later.
	Requeue bool
}

// Reconcile runs work for the task under its lease. work gets a context that ends when the
// lease could be lost (renewals failing, the lease taken over), and the lease's fence to hand
// to what it writes.
func (sm *StateMachine) Reconcile(ctx context.Context, taskName string, work func(ctx context.Context, fence uint64) error) (Result, error) {
	lease, acquired, err := sm.acquireTaskLease(ctx, taskName)
	if err != nil {
		return Result{}, err
	}
	if !acquired {
		return Result{Requeue: true}, nil
	}
	defer lease.Release(context.Background())
	workCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	go func() {
		select {
		case <-lease.Context().Done():
			cancel()
		case <-workCtx.Done():
		}
	}()
	return Result{}, work(workCtx, lease.Fence())
}
