package leasehold

/*
#include <stdlib.h>
#include "leasehold.h"
*/
import "C"

import (
	"context"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// liveLeases counts the lease handles not yet freed (read by the tests).
var liveLeases int64

// Lease is a lock (or permit) this process holds, renewed in the background until Release.
// It is safe for concurrent use by many goroutines.
//
// Work done under the lease should run under Context(), which is cancelled before the lease
// could be taken by another holder: when renewals have failed into the loss grace (stop-by),
// when the lease is lost, and when it is released. Before each write the lease protects, check
// IsCurrent and hand Fence to the resource.
//
// Release every lease. One that is dropped unreleased is released when the garbage collector
// finds it (Settle waits for such releases before exit); until then it stays held and renewed.
type Lease struct{ *leaseState }

type leaseState struct {
	key, holder, token string
	fence              uint64

	mu sync.RWMutex // held (read) by every call into the handle, (write) to free it
	c  *C.lh_lease  // nil once freed

	ctx     context.Context
	stop    context.CancelFunc
	lost    chan struct{}
	handoff chan struct{}

	wmu     sync.Mutex // guards the watcher's start against free
	freed   bool
	watcher *C.lh_cancel  // ends the watcher's wait; nil until it starts
	wdone   chan struct{} // closed when the watcher returned

	rmu      sync.Mutex // one Release at a time
	released bool
}

func newLease(c *C.lh_lease) *Lease {
	s := &leaseState{
		c:       c,
		key:     C.GoString(C.lh_lease_key(c)),
		holder:  C.GoString(C.lh_lease_holder(c)),
		token:   C.GoString(C.lh_lease_token(c)),
		fence:   uint64(C.lh_lease_fence(c)),
		lost:    make(chan struct{}),
		handoff: make(chan struct{}),
	}
	s.ctx, s.stop = context.WithCancel(context.Background())
	atomic.AddInt64(&liveLeases, 1)
	l := &Lease{s}
	runtime.SetFinalizer(l, func(l *Lease) { l.free() })
	return l
}

// Fence is this acquisition's fence: strictly greater than every earlier fence of the key.
// Hand it to the resource the lease guards, which refuses writes with a fence below the
// highest it has seen.
func (s *leaseState) Fence() uint64 { return s.fence }

// Key is the lease's key.
func (s *leaseState) Key() string { return s.key }

// Holder is the holder identity the lease was taken with.
func (s *leaseState) Holder() string { return s.holder }

// Token is this acquisition's owner token (tells this lease from a later one of the same
// holder).
func (s *leaseState) Token() string { return s.token }

// IsCurrent says whether the lease is surely still ours: not lost, not released, before
// ValidUntil. It asks no store: check it before each write the lease protects.
func (s *leaseState) IsCurrent() bool {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.c != nil && bool(C.lh_lease_is_current(s.c))
}

// ValidUntil is until when the lease is surely ours: when the last successful grant or
// renewal was sent, plus the TTL, less the drift margin. It moves with each renewal. Zero once
// released.
func (s *leaseState) ValidUntil() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.c == nil {
		return time.Time{}
	}
	return monotonicToTime(C.lh_lease_valid_until_ns(s.c))
}

// StopBy is when Context is cancelled unless a renewal moves it: ValidUntil less the loss
// grace. Zero once released.
func (s *leaseState) StopBy() time.Time {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.c == nil {
		return time.Time{}
	}
	return monotonicToTime(C.lh_lease_stop_by_ns(s.c))
}

// Context is cancelled when work under the lease must stop: renewals have failed into the
// loss grace (the lease is still valid until ValidUntil, so work passed this context stops in
// time), the lease is lost, or it was released. It is never cancelled otherwise.
func (s *leaseState) Context() context.Context {
	s.watch()
	return s.ctx
}

// Lost is closed when the lease is lost: expired, taken over or force-released (the store
// said it is gone, or renewals could not reach it before ValidUntil).
func (s *leaseState) Lost() <-chan struct{} {
	s.watch()
	return s.lost
}

// HandoffRequested is closed when a waiter asked for the lease (seen at a renewal):
// checkpoint and Release, and it goes to that waiter (HandoffWaiter names it).
func (s *leaseState) HandoffRequested() <-chan struct{} {
	s.watch()
	return s.handoff
}

// LostReason says why the lease was lost, in words; "" when it is not lost.
func (s *leaseState) LostReason() string {
	return s.stringCall(func(c *C.lh_lease, out **C.char, e **C.lh_error) C.lh_status {
		return C.lh_lease_lost_reason(c, out, e)
	})
}

// HandoffWaiter is the identity of the waiter that asked for the lease; "" when none has.
func (s *leaseState) HandoffWaiter() string {
	return s.stringCall(func(c *C.lh_lease, out **C.char, e **C.lh_error) C.lh_status {
		return C.lh_lease_handoff_waiter(c, out, e)
	})
}

func (s *leaseState) stringCall(call func(*C.lh_lease, **C.char, **C.lh_error) C.lh_status) string {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.c == nil {
		return ""
	}
	var out *C.char
	if call(s.c, &out, nil) != stOK {
		return ""
	}
	text, _ := takeString(out)
	return text
}

// Record is the lease's record as it was when the lease was granted, labels included.
func (s *leaseState) Record() (*Record, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.c == nil {
		return nil, &Error{Code: CodeInvalidArgument, Key: s.key, Message: "the lease was released"}
	}
	var out *C.char
	var cerr *C.lh_error
	if st := C.lh_lease_record_json(s.c, &out, &cerr); st != stOK {
		return nil, takeError(st, cerr, s.key)
	}
	text, _ := takeString(out)
	return parseRecord(text)
}

// Release releases the lease and cancels its Context. It is idempotent: later calls return
// nil. It returns an error matching ErrLost when the lease was no longer ours. Cancelling ctx
// returns at once (the error wraps ctx.Err()) and lets the release finish in the background.
func (s *leaseState) Release(ctx context.Context) error {
	s.rmu.Lock()
	defer s.rmu.Unlock()
	if s.released {
		return nil
	}
	var err error
	s.mu.RLock()
	if s.c != nil {
		c := s.c
		var outcome C.lh_release_outcome
		err = blocking(ctx, nil, s.key, func(cancel *C.lh_cancel, cerr **C.lh_error) C.lh_status {
			return C.lh_lease_release(c, cancel, &outcome, cerr)
		})
	}
	s.mu.RUnlock()
	s.released = true
	s.stop()
	s.free()
	return err
}

// watch starts the goroutine that turns the lease's events into Context, Lost and
// HandoffRequested, once. It waits in the library without asking the store.
func (s *leaseState) watch() {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	if s.watcher != nil {
		return
	}
	if s.freed {
		s.stop()
		return
	}
	var cerr *C.lh_error
	if st := C.lh_cancel_new(&s.watcher, &cerr); st != stOK {
		// Without a handle to end the wait, watch by polling is not offered: stop the work.
		takeError(st, cerr, s.key)
		s.watcher = nil
		s.stop()
		return
	}
	s.wdone = make(chan struct{})
	go s.watchEvents(s.watcher, s.wdone)
}

func (s *leaseState) watchEvents(cancel *C.lh_cancel, done chan struct{}) {
	defer close(done)
	defer s.stop()
	mask := C.uint32_t(C.LH_EVENT_LOST | C.LH_EVENT_MUST_STOP | C.LH_EVENT_HANDOFF_REQUESTED)
	for {
		var events C.uint32_t
		s.mu.RLock()
		if s.c == nil {
			s.mu.RUnlock()
			return
		}
		st := C.lh_lease_wait_event(s.c, mask, -1, cancel, &events, nil)
		s.mu.RUnlock()
		if st != stOK {
			return // cancelled: the lease is being freed
		}
		if events&C.LH_EVENT_HANDOFF_REQUESTED != 0 {
			close(s.handoff)
			mask &^= C.LH_EVENT_HANDOFF_REQUESTED
		}
		if events&C.LH_EVENT_LOST != 0 {
			s.stop() // before Lost closes: a reader of Lost sees the context ended
			close(s.lost)
			return
		}
		if events&C.LH_EVENT_MUST_STOP != 0 {
			s.stop()
			mask &^= C.LH_EVENT_MUST_STOP
		}
		if events&C.LH_EVENT_RELEASED != 0 {
			return
		}
	}
}

// free releases the handle (in the background when the lease was not released) once the
// calls running on it returned, and ends the watcher.
func (s *leaseState) free() {
	s.wmu.Lock()
	if s.freed {
		s.wmu.Unlock()
		return
	}
	s.freed = true
	watcher, wdone := s.watcher, s.wdone
	s.wmu.Unlock()
	if watcher != nil {
		C.lh_cancel_fire(watcher)
	}
	s.mu.Lock()
	C.lh_lease_free(s.c)
	s.c = nil
	s.mu.Unlock()
	atomic.AddInt64(&liveLeases, -1)
	if watcher != nil {
		<-wdone
		C.lh_cancel_free(watcher)
	}
	s.stop()
}
