// Package lockmanager is a Kubernetes lock manager with the contract services had written by
// hand over Leases — AcquireLock returns (true, nil) when the lock is taken, (false, nil) when
// another pod holds it, (false, err) when the store failed — written with leasehold.
//
// The store makes the Lease names: a key that is a DNS-1123 name becomes prefix + key, any
// other (a long signal fingerprint) prefix + a readable part + 16 hex digits of its SHA-256, at
// most 63 characters, so no service hashes names by hand. The leases renew themselves, carry a
// fence, and are released (not left to expire) by ReleaseLock.
package lockmanager

import (
	"context"
	"fmt"
	"sync"
	"time"

	"leasehold.dev/leasehold"
)

// DistributedLockManager takes locks per key, one lease per key held by this process.
type DistributedLockManager struct {
	locks *leasehold.Locks
	ttl   time.Duration

	mu   sync.Mutex
	held map[string]*leasehold.Lease
}

// New makes a lock manager over locks (for example
// leasehold.Connect(ctx, "k8s://my-namespace?prefix=gw-lock-")) with leases of ttl.
func New(locks *leasehold.Locks, ttl time.Duration) *DistributedLockManager {
	return &DistributedLockManager{locks: locks, ttl: ttl, held: map[string]*leasehold.Lease{}}
}

// AcquireLock takes the lock for key without waiting:
//   - (true, nil): taken, or already held by this manager (idempotent);
//   - (false, nil): held by another pod (or being released by this one): retry later;
//   - (false, err): the store failed (unreachable, permission denied, bad key).
func (m *DistributedLockManager) AcquireLock(ctx context.Context, key string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if lease, ok := m.held[key]; ok {
		if lease.IsCurrent() {
			return true, nil
		}
		_ = lease.Release(ctx) // lost meanwhile: take it again below
		delete(m.held, key)
	}
	lease, err := m.locks.Lock(key, leasehold.WithTTL(m.ttl)).TryAcquire(ctx)
	if err != nil {
		return false, fmt.Errorf("acquiring lock %q: %w", key, err)
	}
	if lease == nil {
		return false, nil
	}
	m.held[key] = lease
	return true, nil
}

// Fence is the fence of the lease this manager holds on key (0 when it holds none): hand it to
// the resource the lock guards.
func (m *DistributedLockManager) Fence(key string) uint64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	if lease, ok := m.held[key]; ok {
		return lease.Fence()
	}
	return 0
}

// ReleaseLock releases the lock for key. Idempotent: safe to call when the lock is not held.
// A lease lost meanwhile is reported as an error matching leasehold.ErrLost.
func (m *DistributedLockManager) ReleaseLock(ctx context.Context, key string) error {
	m.mu.Lock()
	lease, ok := m.held[key]
	delete(m.held, key)
	m.mu.Unlock()
	if !ok {
		return nil
	}
	if err := lease.Release(ctx); err != nil {
		return fmt.Errorf("releasing lock %q: %w", key, err)
	}
	return nil
}
