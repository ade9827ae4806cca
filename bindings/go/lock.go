package leasehold

/*
#include <stdlib.h>
#include "leasehold.h"
*/
import "C"

import (
	"context"
	"time"
)

// LockOption sets an option of a lock, semaphore or read-write lock.
type LockOption func(*lockOptions)

type lockOptions struct {
	ttl, wait, renewEvery, lossGrace, waiterTTL *time.Duration
	registerWaiter, autoRenew                   *bool
	backoff                                     *[2]time.Duration
	labels                                      [][2]string
}

// WithTTL sets the time to live (default 30 s; from 10 ms to one year). A holder that stops
// renewing loses the lease after it.
func WithTTL(d time.Duration) LockOption { return func(o *lockOptions) { o.ttl = &d } }

// WithWait sets how long Acquire waits for a held key before failing with ErrTimeout (naming
// the holder). 0: do not wait. By default Acquire waits until its ctx ends; a ctx deadline is
// the other way to bound the wait (then the error is context.DeadlineExceeded).
func WithWait(d time.Duration) LockOption {
	return func(o *lockOptions) { o.wait = &d }
}

// WithRenewEvery sets the renewal period (default TTL/3); it is also how often the holder
// learns that a waiter asked for the lease.
func WithRenewEvery(d time.Duration) LockOption { return func(o *lockOptions) { o.renewEvery = &d } }

// WithLossGrace sets how long before the lease could expire its Context is cancelled when
// renewals have not succeeded (default min(TTL/3, (TTL − renewal period − drift)/2)).
func WithLossGrace(d time.Duration) LockOption { return func(o *lockOptions) { o.lossGrace = &d } }

// WithWaiterTTL sets the lifetime of a waiter's registration (default min(TTL, 5 s)).
func WithWaiterTTL(d time.Duration) LockOption { return func(o *lockOptions) { o.waiterTTL = &d } }

// WithRegisterWaiter sets whether a waiting Acquire takes a place in the store's line of
// waiters (default true): the holder's HandoffRequested fires and, once freed, the lease is
// reserved for the first in line.
func WithRegisterWaiter(on bool) LockOption { return func(o *lockOptions) { o.registerWaiter = &on } }

// WithAutoRenew sets whether the lease renews itself (default true). Without renewal it lives
// one TTL.
func WithAutoRenew(on bool) LockOption { return func(o *lockOptions) { o.autoRenew = &on } }

// WithBackoff sets the backoff between attempts while waiting and between retries of a failed
// renewal (default 5 ms doubling to 500 ms, jittered).
func WithBackoff(initial, max time.Duration) LockOption {
	return func(o *lockOptions) { o.backoff = &[2]time.Duration{initial, max} }
}

// WithLabel adds a label stored with the lease (task id, purpose …); a second label of the
// same name replaces the first.
func WithLabel(name, value string) LockOption {
	return func(o *lockOptions) { o.labels = append(o.labels, [2]string{name, value}) }
}

// toC makes the C options handle; free it with C.lh_lock_options_free.
func (o *lockOptions) toC() (*C.lh_lock_options, error) {
	var h *C.lh_lock_options
	var cerr *C.lh_error
	if st := C.lh_lock_options_new(&h, &cerr); st != stOK {
		return nil, takeError(st, cerr, "")
	}
	if err := o.fill(h); err != nil {
		C.lh_lock_options_free(h)
		return nil, err
	}
	return h, nil
}

func (o *lockOptions) fill(h *C.lh_lock_options) error {
	var cerr *C.lh_error
	check := func(st C.lh_status) error {
		if st != stOK {
			return takeError(st, cerr, "")
		}
		return nil
	}
	type msOption struct {
		d    *time.Duration
		name string
		set  func(C.uint64_t) C.lh_status
	}
	for _, m := range []msOption{
		{o.ttl, "the TTL", func(v C.uint64_t) C.lh_status { return C.lh_lock_options_set_ttl_ms(h, v, &cerr) }},
		{o.wait, "the wait limit", func(v C.uint64_t) C.lh_status { return C.lh_lock_options_set_wait_ms(h, v, &cerr) }},
		{o.renewEvery, "the renewal period", func(v C.uint64_t) C.lh_status { return C.lh_lock_options_set_renew_every_ms(h, v, &cerr) }},
		{o.lossGrace, "the loss grace", func(v C.uint64_t) C.lh_status { return C.lh_lock_options_set_loss_grace_ms(h, v, &cerr) }},
		{o.waiterTTL, "the waiter TTL", func(v C.uint64_t) C.lh_status { return C.lh_lock_options_set_waiter_ttl_ms(h, v, &cerr) }},
	} {
		if m.d == nil {
			continue
		}
		ms, err := millis(*m.d, m.name)
		if err != nil {
			return err
		}
		if err := check(m.set(ms)); err != nil {
			return err
		}
	}
	if o.registerWaiter != nil {
		if err := check(C.lh_lock_options_set_register_waiter(h, C.bool(*o.registerWaiter), &cerr)); err != nil {
			return err
		}
	}
	if o.autoRenew != nil {
		if err := check(C.lh_lock_options_set_auto_renew(h, C.bool(*o.autoRenew), &cerr)); err != nil {
			return err
		}
	}
	if o.backoff != nil {
		initial, err := millis(o.backoff[0], "the initial backoff")
		if err != nil {
			return err
		}
		max, err := millis(o.backoff[1], "the maximum backoff")
		if err != nil {
			return err
		}
		if err := check(C.lh_lock_options_set_backoff_ms(h, initial, max, &cerr)); err != nil {
			return err
		}
	}
	for _, l := range o.labels {
		name, err := cString(l[0], "a label's name")
		if err != nil {
			return err
		}
		value, err := cString(l[1], "a label's value")
		if err != nil {
			free(name)
			return err
		}
		st := C.lh_lock_options_add_label(h, name, value, &cerr)
		free(name)
		free(value)
		if err := check(st); err != nil {
			return err
		}
	}
	return nil
}

type lockKind int

const (
	kindLock lockKind = iota
	kindSemaphore
	kindRead
	kindWrite
)

// Lock is a lock (or a semaphore's permit, or a read-write lock's read or write permit) on one
// key, with its options: Acquire and TryAcquire take a Lease. A Lock is a description, cheap
// to make and safe for concurrent use; each acquisition is its own lease.
type Lock struct {
	locks   *Locks
	key     string
	kind    lockKind
	permits int
	opts    lockOptions
}

// Lock describes the lock key.
//
//	lease, err := locks.Lock("invoice:42", leasehold.WithTTL(10*time.Second)).Acquire(ctx)
func (l *Locks) Lock(key string, opts ...LockOption) *Lock {
	return l.newLock(key, kindLock, 0, opts)
}

// Semaphore describes the semaphore key of n permits (1 to 64): at most n holders at once,
// across processes and hosts, each with its own fence; waiters served in arrival order. Every
// holder of the key must give the same n (else ErrInvalidInput).
func (l *Locks) Semaphore(key string, n int, opts ...LockOption) *Lock {
	return l.newLock(key, kindSemaphore, n, opts)
}

// ReadWrite describes the read-write lock key: Read permits are shared with other readers,
// the Write permit is alone on the key.
func (l *Locks) ReadWrite(key string, opts ...LockOption) *ReadWrite {
	return &ReadWrite{read: l.newLock(key, kindRead, 0, opts), write: l.newLock(key, kindWrite, 0, opts)}
}

// ReadWrite is a read-write lock on one key.
type ReadWrite struct{ read, write *Lock }

// Read is the read permit: shared with other readers, not granted while a writer waits ahead.
func (rw *ReadWrite) Read() *Lock { return rw.read }

// Write is the write permit: alone on the key.
func (rw *ReadWrite) Write() *Lock { return rw.write }

func (l *Locks) newLock(key string, kind lockKind, permits int, opts []LockOption) *Lock {
	lk := &Lock{locks: l, key: key, kind: kind, permits: permits}
	for _, opt := range opts {
		opt(&lk.opts)
	}
	return lk
}

// Key is the lock's key.
func (lk *Lock) Key() string { return lk.key }

// Acquire takes the lock, waiting while it is held elsewhere: until ctx ends, or up to the
// WithWait limit (then ErrTimeout, naming the holder). Waiters wake on the store's change
// notification where it has one, and take a place in its line of waiters
// (WithRegisterWaiter). Cancelling ctx withdraws that place and releases a grant that was in
// flight, so nothing is left held or queued; the error then wraps ctx.Err().
//
// The lease renews itself until Release. Errors: ErrTimeout, ErrInvalidInput (an empty or
// unacceptable key, an option that cannot work), ErrNotSupported, a store error that cannot
// heal (retryable ones are retried while waiting), ErrClosed.
func (lk *Lock) Acquire(ctx context.Context) (*Lease, error) {
	return lk.acquire(ctx, false)
}

// TryAcquire takes the lock if it is free, without waiting: (nil, nil) when another holder,
// or another goroutine through the same Locks, has it. Contention is not an error.
func (lk *Lock) TryAcquire(ctx context.Context) (*Lease, error) {
	return lk.acquire(ctx, true)
}

func (lk *Lock) acquire(ctx context.Context, try bool) (*Lease, error) {
	if lk.kind == kindSemaphore && (lk.permits < 1 || lk.permits > 64) {
		return nil, &Error{Code: CodeInvalidOption, Key: lk.key, Message: "a semaphore's permits must be from 1 to 64"}
	}
	ckey, err := cString(lk.key, "the key")
	if err != nil {
		return nil, err
	}
	defer free(ckey)
	copts, err := lk.opts.toC()
	if err != nil {
		return nil, err
	}
	defer C.lh_lock_options_free(copts)
	var out *C.lh_lease
	err = lk.locks.use(func(c *C.lh_locks) error {
		return blocking(ctx, lk.locks.closed, lk.key, func(cancel *C.lh_cancel, cerr **C.lh_error) C.lh_status {
			switch {
			case lk.kind == kindLock && try:
				return C.lh_lock_try_acquire(c, ckey, copts, cancel, &out, cerr)
			case lk.kind == kindLock:
				return C.lh_lock_acquire(c, ckey, copts, cancel, &out, cerr)
			case lk.kind == kindSemaphore && try:
				return C.lh_semaphore_try_acquire(c, ckey, C.uint32_t(lk.permits), copts, cancel, &out, cerr)
			case lk.kind == kindSemaphore:
				return C.lh_semaphore_acquire(c, ckey, C.uint32_t(lk.permits), copts, cancel, &out, cerr)
			}
			mode := C.uint32_t(C.LH_RW_READ)
			if lk.kind == kindWrite {
				mode = C.LH_RW_WRITE
			}
			if try {
				return C.lh_rwlock_try_acquire(c, ckey, mode, copts, cancel, &out, cerr)
			}
			return C.lh_rwlock_acquire(c, ckey, mode, copts, cancel, &out, cerr)
		})
	})
	if err == errHeld {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return newLease(out), nil
}
