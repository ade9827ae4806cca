// Package agentlocks runs each trading agent in exactly one pod: one lock per agent on Redis,
// 30 s TTL renewed every 20 s (2/3 of the TTL), many agents per pod, and every lock released on
// SIGTERM within Kubernetes' grace period — written with leasehold.
//
// An agent runs under its lease's context: if renewals fail for long enough that the lease
// could be lost, the agent is stopped before another pod could be granted it. An agent that
// does not stop within the shutdown limit keeps its lock, which expires by its TTL once the
// process is gone: never released under a running agent.
package agentlocks

import (
	"context"
	"errors"
	"fmt"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"leasehold.dev/leasehold"
)

// The lock timings of the agents.
const (
	TTL           = 30 * time.Second
	RenewEvery    = 20 * time.Second
	ShutdownLimit = 25 * time.Second // Kubernetes gives 30 s (terminationGracePeriodSeconds)
)

// ErrRunningElsewhere: the agent's lock is held by another pod (or this one).
var ErrRunningElsewhere = errors.New("agent already running in another pod")

type runner struct {
	lease *leasehold.Lease
	stop  context.CancelFunc
	done  chan struct{}
}

// Manager starts and stops the agents of one pod.
type Manager struct {
	// TTL and RenewEvery are the timings of the locks StartAgent takes (TTL and RenewEvery
	// unless changed before the first StartAgent).
	TTL, RenewEvery time.Duration

	locks *leasehold.Locks
	mu    sync.Mutex
	runs  map[string]*runner
}

// NewManager makes a manager over locks (leasehold.Connect(ctx, "redis://redis:6379")).
func NewManager(locks *leasehold.Locks) *Manager {
	return &Manager{TTL: TTL, RenewEvery: RenewEvery, locks: locks, runs: map[string]*runner{}}
}

// StartAgent takes the agent's lock without waiting and runs agent under it in a goroutine:
// ErrRunningElsewhere when another pod runs it. agent gets a context that ends when the agent
// must stop (StopAgent, Shutdown, or the lock at risk) and the lock's fence.
func (m *Manager) StartAgent(ctx context.Context, agentID string, agent func(ctx context.Context, fence uint64)) error {
	lease, err := m.locks.Lock("agent/"+agentID,
		leasehold.WithTTL(m.TTL), leasehold.WithRenewEvery(m.RenewEvery)).TryAcquire(ctx)
	if err != nil {
		return fmt.Errorf("agent %s: %w", agentID, err)
	}
	if lease == nil {
		return fmt.Errorf("agent %s: %w", agentID, ErrRunningElsewhere)
	}
	agentCtx, stop := context.WithCancel(lease.Context())
	r := &runner{lease: lease, stop: stop, done: make(chan struct{})}
	m.mu.Lock()
	m.runs[agentID] = r
	m.mu.Unlock()
	go func() {
		defer close(r.done)
		agent(agentCtx, lease.Fence())
	}()
	return nil
}

// StopAgent stops one agent, waits for it (until ctx ends), then releases its lock.
func (m *Manager) StopAgent(ctx context.Context, agentID string) error {
	m.mu.Lock()
	r, ok := m.runs[agentID]
	delete(m.runs, agentID)
	m.mu.Unlock()
	if !ok {
		return nil
	}
	return r.stopAndRelease(ctx)
}

func (r *runner) stopAndRelease(ctx context.Context) error {
	r.stop()
	select {
	case <-r.done:
	case <-ctx.Done():
		return fmt.Errorf("agent %s did not stop: its lock expires by its TTL: %w", r.lease.Key(), ctx.Err())
	}
	return r.lease.Release(context.Background())
}

// Shutdown stops every agent at once and releases each one's lock as soon as it stopped,
// within ctx. It returns the agents that did not stop in time (their locks left to expire).
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	runs := m.runs
	m.runs = map[string]*runner{}
	m.mu.Unlock()
	errs := make(chan error, len(runs))
	for _, r := range runs {
		r := r
		go func() { errs <- r.stopAndRelease(ctx) }()
	}
	var first error
	for range runs {
		if err := <-errs; err != nil && first == nil {
			first = err
		}
	}
	return first
}

// Serve is a pod's main loop: it starts agentIDs (skipping those running elsewhere), calls
// ready, and on SIGTERM or SIGINT stops them all and releases their locks within
// ShutdownLimit.
func Serve(storeURL string, agentIDs []string, agent func(ctx context.Context, id string, fence uint64), ready func(started []string)) error {
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	locks, err := leasehold.Connect(ctx, storeURL)
	if err != nil {
		return err
	}
	defer locks.Close()
	m := NewManager(locks)
	var started []string
	for _, id := range agentIDs {
		id := id
		err := m.StartAgent(ctx, id, func(ctx context.Context, fence uint64) { agent(ctx, id, fence) })
		if errors.Is(err, ErrRunningElsewhere) {
			continue
		}
		if err != nil {
			return err
		}
		started = append(started, id)
	}
	ready(started)
	<-ctx.Done()
	shutdown, cancel := context.WithTimeout(context.Background(), ShutdownLimit)
	defer cancel()
	return m.Shutdown(shutdown)
}
