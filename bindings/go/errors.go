package leasehold

import (
	"errors"
	"fmt"
	"time"
)

// Sentinel errors, for errors.Is. Every error this package returns is an *Error whose Is
// matches the sentinel of its kind:
//
//	lease, err := locks.Lock("report").Acquire(ctx)
//	switch {
//	case errors.Is(err, leasehold.ErrTimeout): // held elsewhere for the whole wait limit
//	case errors.Is(err, context.Canceled):     // ctx was cancelled: nothing is left held or queued
//	case errors.Is(err, leasehold.ErrUnavailable): // the store did not answer; a retry may help
//	}
var (
	// ErrTimeout: an acquisition waited for its whole wait limit (WithWait) and the key stayed
	// held; the *Error names the holder and the time waited.
	ErrTimeout = errors.New("leasehold: timed out waiting for the lock")
	// ErrLost: the lease was lost (expired, taken over or force-released) before Release.
	ErrLost = errors.New("leasehold: lease lost")
	// ErrUnavailable: the store could not be reached or did not answer in time.
	ErrUnavailable = errors.New("leasehold: store unavailable")
	// ErrInvalidInput: a key, URL, option or argument that cannot work (empty key, bad URL,
	// negative TTL, a semaphore count out of range).
	ErrInvalidInput = errors.New("leasehold: invalid input")
	// ErrNotSupported: the store cannot do what was asked (permits on a store without them),
	// or the library was built without the store the URL names.
	ErrNotSupported = errors.New("leasehold: not supported")
	// ErrStore: the store refused the request or answered something not understood, or its
	// record for the key is corrupt (Retryable says whether a retry can help).
	ErrStore = errors.New("leasehold: store error")
	// ErrClosed: the Locks was closed.
	ErrClosed = errors.New("leasehold: closed")
)

// Code says what failed; the numbers are the C library's statuses (lh_status).
type Code uint32

// The codes, as leasehold.h numbers them.
const (
	CodeCancelled         Code = 2
	CodeTimeout           Code = 3
	CodeLost              Code = 4
	CodeInvalidArgument   Code = 5
	CodeInvalidKey        Code = 6
	CodeInvalidURL        Code = 7
	CodeInvalidOption     Code = 8
	CodeFeatureNotEnabled Code = 9
	CodeNotSupported      Code = 10
	CodeUnavailable       Code = 11
	CodeStore             Code = 12
	CodeCorrupt           Code = 13
	CodeIO                Code = 14
	CodeGivenUp           Code = 15
	CodeNotFound          Code = 16
	CodeForked            Code = 17
	CodeInternal          Code = 18
	CodePanic             Code = 19
)

var codeNames = map[Code]string{
	CodeCancelled: "cancelled", CodeTimeout: "timeout", CodeLost: "lost",
	CodeInvalidArgument: "invalid argument", CodeInvalidKey: "invalid key",
	CodeInvalidURL: "invalid URL", CodeInvalidOption: "invalid option",
	CodeFeatureNotEnabled: "feature not enabled", CodeNotSupported: "not supported",
	CodeUnavailable: "unavailable", CodeStore: "store error", CodeCorrupt: "corrupt record",
	CodeIO: "I/O error", CodeGivenUp: "given up", CodeNotFound: "not found",
	CodeForked: "forked", CodeInternal: "internal error", CodePanic: "panic", codeClosed: "closed",
}

func (c Code) String() string {
	if n, ok := codeNames[c]; ok {
		return n
	}
	return fmt.Sprintf("code %d", uint32(c))
}

// Error is what failed, for errors.As: the code, the library's message, and for a timeout the
// holder and the time waited.
//
//	var e *leasehold.Error
//	if errors.As(err, &e) && e.Code == leasehold.CodeTimeout {
//		log.Printf("%s held by %s for the %s waited", e.Key, e.Holder, e.Waited)
//	}
type Error struct {
	// Code says what failed.
	Code Code
	// Message is the library's description (what failed and, where it can tell, what to do).
	Message string
	// Key is the key the failure is about, when there is one.
	Key string
	// Holder is, for a timeout, who held the key as last seen.
	Holder string
	// Waited is, for a timeout, how long the acquisition waited.
	Waited time.Duration
	// Retryable says whether the same call may succeed if tried again later.
	Retryable bool

	cause error // the context's error, for a call its context ended
}

func (e *Error) Error() string {
	if e.Key != "" && e.Code == CodeTimeout {
		return fmt.Sprintf("leasehold: %s (held by %s, waited %s)", e.Message, e.Holder, e.Waited)
	}
	return "leasehold: " + e.Message
}

// Unwrap returns the context's error when the call's context ended it
// (errors.Is(err, context.Canceled) or context.DeadlineExceeded).
func (e *Error) Unwrap() error { return e.cause }

// Is matches the sentinel of the error's kind.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrTimeout:
		return e.Code == CodeTimeout
	case ErrLost:
		return e.Code == CodeLost
	case ErrUnavailable:
		return e.Code == CodeUnavailable
	case ErrInvalidInput:
		switch e.Code {
		case CodeInvalidArgument, CodeInvalidKey, CodeInvalidURL, CodeInvalidOption:
			return true
		}
	case ErrNotSupported:
		return e.Code == CodeNotSupported || e.Code == CodeFeatureNotEnabled
	case ErrStore:
		return e.Code == CodeStore || e.Code == CodeCorrupt || e.Code == CodeIO
	case ErrClosed:
		return e.Code == codeClosed
	}
	return false
}

// codeClosed marks a call on a closed Locks (not a library status).
const codeClosed Code = 1000

func closedError() *Error {
	return &Error{Code: codeClosed, Message: "the Locks is closed"}
}
