package leasehold

/*
#include <stdlib.h>
#include "leasehold.h"
*/
import "C"

import (
	"context"
	"encoding/json"
	"runtime"
	"sync"
	"time"
)

// Option sets an option of Connect.
type Option func(*connectOptions)

type connectOptions struct {
	holder     *string
	localLayer *bool
}

// WithHolder sets the holder identity written into every lease taken through the client and
// shown to contenders (`leasehold inspect`). By default it is POD_NAMESPACE/POD_NAME in
// Kubernetes, else host-pid-random.
func WithHolder(holder string) Option {
	return func(o *connectOptions) { o.holder = &holder }
}

// WithLocalLayer turns the in-process layer on (the default) or off. With it on, acquisitions
// of one key through one Locks queue inside the process first come, first served, and a
// released lease can pass to the next of them without a store call; with it off each is a
// contender in the store like another process.
func WithLocalLayer(on bool) Option {
	return func(o *connectOptions) { o.localLayer = &on }
}

// Locks is one client of one store with one holder identity. It is safe for concurrent use
// by many goroutines. Leases taken through it stay usable after Close.
type Locks struct {
	mu     sync.RWMutex
	c      *C.lh_locks   // nil once closed
	closed chan struct{} // closed by Close: ends the calls running
	once   sync.Once
	holder string
	store  string
}

// Connect opens the store url names: every URL the leasehold command takes
// (redis://, rediss://, redis+sentinel://, redis+cluster://, redlock://, postgres://,
// etcd://, k8s://, gs://, s3://, azblob://, file://, memory://). Cancelling ctx ends the
// opening.
//
//	locks, err := leasehold.Connect(ctx, "redis://10.0.0.5:6379", leasehold.WithHolder("web-1"))
//
// Errors: ErrInvalidInput for a URL that cannot be understood, ErrNotSupported for a store
// this library was built without, the store's own (ErrUnavailable, ErrStore).
func Connect(ctx context.Context, url string, opts ...Option) (*Locks, error) {
	var o connectOptions
	for _, opt := range opts {
		opt(&o)
	}
	curl, err := cString(url, "the store URL")
	if err != nil {
		return nil, err
	}
	defer free(curl)
	var copts *C.lh_connect_options
	var cerr *C.lh_error
	if st := C.lh_connect_options_new(&copts, &cerr); st != stOK {
		return nil, takeError(st, cerr, "")
	}
	defer C.lh_connect_options_free(copts)
	if o.holder != nil {
		h, err := cString(*o.holder, "the holder identity")
		if err != nil {
			return nil, err
		}
		st := C.lh_connect_options_set_holder(copts, h, &cerr)
		free(h)
		if st != stOK {
			return nil, takeError(st, cerr, "")
		}
	}
	if o.localLayer != nil {
		if st := C.lh_connect_options_set_local_layer(copts, C.bool(*o.localLayer), &cerr); st != stOK {
			return nil, takeError(st, cerr, "")
		}
	}
	var c *C.lh_locks
	err = blocking(ctx, nil, "", func(cancel *C.lh_cancel, cerr **C.lh_error) C.lh_status {
		return C.lh_locks_connect(curl, copts, cancel, &c, cerr)
	})
	if err != nil {
		return nil, err
	}
	l := &Locks{
		c:      c,
		closed: make(chan struct{}),
		holder: C.GoString(C.lh_locks_holder(c)),
		store:  C.GoString(C.lh_locks_store(c)),
	}
	runtime.SetFinalizer(l, (*Locks).Close)
	return l, nil
}

// Holder is the client's holder identity.
func (l *Locks) Holder() string { return l.holder }

// Store is the store, described without credentials ("redis://127.0.0.1:6379/0").
func (l *Locks) Store() string { return l.store }

// Close frees the client. Calls running on it (an Acquire waiting for a key) end with
// ErrClosed, leaving nothing held or queued; later calls fail with ErrClosed. Leases taken
// through it are not released: they stay usable until released. Close is idempotent.
func (l *Locks) Close() error {
	l.once.Do(func() { close(l.closed) })
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.c != nil {
		C.lh_locks_free(l.c)
		l.c = nil
		runtime.SetFinalizer(l, nil)
	}
	return nil
}

// use runs f with the live client handle, holding it open meanwhile.
func (l *Locks) use(f func(c *C.lh_locks) error) error {
	l.mu.RLock()
	defer l.mu.RUnlock()
	if l.c == nil {
		return closedError()
	}
	return f(l.c)
}

// Record is a key's record as the store keeps it (the JSON `leasehold inspect` shows).
type Record struct {
	Key    string  `json:"key"`
	Holder *string `json:"holder"`
	Token  *string `json:"token"`
	// Fence is the fence of the latest acquisition (for a semaphore or read-write key, the
	// last fence the key issued; the holders are in Permits).
	Fence    uint64    `json:"fence"`
	Acquired time.Time `json:"acquired"`
	Renewed  time.Time `json:"renewed"`
	// Expires is when the lease expires unless renewed, on the holder's clock.
	Expires time.Time         `json:"expires"`
	TTLMs   uint64            `json:"ttl_ms"`
	Waiter  *string           `json:"waiter"`
	PID     *uint32           `json:"pid"`
	Host    *string           `json:"host"`
	Labels  map[string]string `json:"labels"`
	// Permits is the permit table of a semaphore or read-write key; nil for a lock.
	Permits *Permits `json:"permits"`
	// JSON is the whole record as the library wrote it, fields this struct does not name
	// included.
	JSON json.RawMessage `json:"-"`
}

// Permits is the permit table of a semaphore or read-write key.
type Permits struct {
	// Kind is "semaphore" or "read-write".
	Kind string `json:"kind"`
	// Count is a semaphore's number of permits (0 for a read-write lock).
	Count   int      `json:"permits"`
	Holders []Permit `json:"holders"`
}

// Permit is one permit held on a semaphore or read-write key.
type Permit struct {
	Holder  string    `json:"holder"`
	Token   string    `json:"token"`
	Fence   uint64    `json:"fence"`
	Write   bool      `json:"write"`
	Expires time.Time `json:"expires"`
	TTLMs   uint64    `json:"ttl_ms"`
}

// Held says whether the record names a holder (a lock's) or any permit holder.
func (r *Record) Held() bool {
	return r.Holder != nil || (r.Permits != nil && len(r.Permits.Holders) > 0)
}

func parseRecord(text string) (*Record, error) {
	var r Record
	if err := json.Unmarshal([]byte(text), &r); err != nil {
		return nil, &Error{Code: CodeCorrupt, Message: "the record's JSON: " + err.Error()}
	}
	r.JSON = json.RawMessage(text)
	return &r, nil
}

// recordCall runs one of the record-returning calls (inspect, force-release).
func (l *Locks) recordCall(ctx context.Context, key string,
	call func(c *C.lh_locks, key *C.char, cancel *C.lh_cancel, json **C.char, err **C.lh_error) C.lh_status,
) (*Record, error) {
	ckey, err := cString(key, "the key")
	if err != nil {
		return nil, err
	}
	defer free(ckey)
	var text *C.char
	err = l.use(func(c *C.lh_locks) error {
		return blocking(ctx, l.closed, key, func(cancel *C.lh_cancel, cerr **C.lh_error) C.lh_status {
			return call(c, ckey, cancel, &text, cerr)
		})
	})
	if err != nil {
		return nil, err
	}
	s, ok := takeString(text)
	if !ok {
		return nil, nil
	}
	return parseRecord(s)
}

// Inspect reads the record the store keeps for key, or nil when it has none. It takes nothing.
func (l *Locks) Inspect(ctx context.Context, key string) (*Record, error) {
	return l.recordCall(ctx, key, func(c *C.lh_locks, k *C.char, cancel *C.lh_cancel, j **C.char, e **C.lh_error) C.lh_status {
		return C.lh_locks_inspect(c, k, cancel, j, e)
	})
}

// ForceRelease frees key whoever holds it, as `leasehold release --force` does, and returns
// the record it removed (nil when the key was free). The holder's lease is lost at its next
// renewal. A call its ctx cancelled may or may not have freed the key.
func (l *Locks) ForceRelease(ctx context.Context, key string) (*Record, error) {
	return l.recordCall(ctx, key, func(c *C.lh_locks, k *C.char, cancel *C.lh_cancel, j **C.char, e **C.lh_error) C.lh_status {
		return C.lh_locks_force_release(c, k, cancel, j, e)
	})
}
