package leasehold

/*
#cgo CFLAGS: -I${SRCDIR}/lib
#cgo LDFLAGS: ${SRCDIR}/lib/libleasehold.a -lgcc_s -lutil -lrt -lpthread -lm -ldl -lc
#include <stdlib.h>
#include "leasehold.h"
*/
import "C"

import (
	"context"
	"errors"
	"time"
	"unsafe"
)

// The library's statuses (crates/leasehold-ffi/include/leasehold.h).
const (
	stOK   = C.LH_OK
	stHeld = C.LH_HELD
)

// cancelFor ties a blocking call to ctx and to closed (a client being closed; may be nil):
// the returned handle (NULL when neither can end) is fired once either is done. done must be
// called after the call returned; it stops the goroutine that watches them and frees the
// handle.
func cancelFor(ctx context.Context, closed <-chan struct{}) (handle *C.lh_cancel, done func(), err error) {
	if ctx.Done() == nil && closed == nil {
		return nil, func() {}, nil
	}
	var cerr *C.lh_error
	if st := C.lh_cancel_new(&handle, &cerr); st != stOK {
		return nil, nil, takeError(st, cerr, "")
	}
	stop := make(chan struct{})
	exited := make(chan struct{})
	go func() {
		defer close(exited)
		select {
		case <-ctx.Done():
			C.lh_cancel_fire(handle)
		case <-closed:
			C.lh_cancel_fire(handle)
		case <-stop:
		}
	}()
	return handle, func() {
		close(stop)
		<-exited
		C.lh_cancel_free(handle)
	}, nil
}

// blocking runs call with a cancel handle tied to ctx and closed (see cancelFor) and turns its
// status into an error: nil for LH_OK, errHeld for LH_HELD, ctx's error (wrapped) when ctx
// ended the call, ErrClosed when closed did.
func blocking(ctx context.Context, closed <-chan struct{}, key string, call func(cancel *C.lh_cancel, err **C.lh_error) C.lh_status) error {
	if err := ctx.Err(); err != nil {
		return &Error{Code: CodeCancelled, Key: key, Message: err.Error(), cause: err}
	}
	cancel, done, err := cancelFor(ctx, closed)
	if err != nil {
		return err
	}
	var cerr *C.lh_error
	st := call(cancel, &cerr)
	done()
	switch st {
	case stOK:
		return nil
	case stHeld:
		return errHeld
	}
	e := takeError(st, cerr, key)
	if e.Code == CodeCancelled {
		if cause := ctx.Err(); cause != nil {
			e.cause = cause
		} else if isClosed(closed) {
			e.Code = codeClosed
		}
	}
	return e
}

func isClosed(closed <-chan struct{}) bool {
	if closed == nil {
		return false
	}
	select {
	case <-closed:
		return true
	default:
		return false
	}
}

// errHeld is a try-acquire's answer on a key held elsewhere (not returned to users).
var errHeld = errors.New("held")

// takeError turns a status and the error the call made into an *Error, freeing the C error.
func takeError(st C.lh_status, cerr *C.lh_error, key string) *Error {
	e := &Error{Code: Code(st), Key: key}
	if cerr == nil {
		e.Message = C.GoString(C.lh_status_name(C.uint32_t(st)))
		return e
	}
	defer C.lh_error_free(cerr)
	e.Message = C.GoString(C.lh_error_message(cerr))
	if k := C.lh_error_key(cerr); k != nil {
		e.Key = C.GoString(k)
	}
	if h := C.lh_error_holder(cerr); h != nil {
		e.Holder = C.GoString(h)
	}
	e.Waited = time.Duration(C.lh_error_waited_ms(cerr)) * time.Millisecond
	e.Retryable = bool(C.lh_error_retryable(cerr))
	return e
}

// cString is s as a C string to free with C.free, or an error when s holds a NUL byte (which
// C cannot carry).
func cString(s, what string) (*C.char, error) {
	for i := 0; i < len(s); i++ {
		if s[i] == 0 {
			return nil, &Error{Code: CodeInvalidArgument, Message: what + " contains a NUL byte"}
		}
	}
	return C.CString(s), nil
}

func free(p *C.char) { C.free(unsafe.Pointer(p)) }

// takeString copies a string the library handed over and frees it; ok is false for NULL.
func takeString(p *C.char) (s string, ok bool) {
	if p == nil {
		return "", false
	}
	defer C.lh_string_free(p)
	return C.GoString(p), true
}

// millis converts a duration option to whole milliseconds, refusing negative ones.
func millis(d time.Duration, what string) (C.uint64_t, error) {
	if d < 0 {
		return 0, &Error{Code: CodeInvalidOption, Message: what + " must not be negative: " + d.String()}
	}
	return C.uint64_t(d / time.Millisecond), nil
}

// monotonicToTime places a CLOCK_MONOTONIC reading of the library on the wall clock.
func monotonicToTime(ns C.uint64_t) time.Time {
	if ns == 0 {
		return time.Time{}
	}
	now := C.lh_monotonic_now_ns()
	return time.Now().Add(time.Duration(int64(ns) - int64(now)))
}

// Version is the version of the library linked in ("0.1.0").
func Version() string { return C.GoString(C.lh_version()) }

// Settle waits up to timeout for the library's background work to finish: the releases of
// leases dropped without Release and the withdrawals of abandoned waits. Call it before the
// process exits; it returns how many tasks were still running when timeout passed.
func Settle(timeout time.Duration) (left int, err error) {
	ms, err := millis(timeout, "the settle timeout")
	if err != nil {
		return 0, err
	}
	var n C.uint64_t
	var cerr *C.lh_error
	if st := C.lh_settle(ms, &n, &cerr); st != stOK {
		return int(n), takeError(st, cerr, "")
	}
	return int(n), nil
}
