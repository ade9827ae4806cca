package leasehold_test

import (
	"context"
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"

	"leasehold.dev/leasehold"
)

func TestFencesRise(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		locks := connect(t, url)
		lk := locks.Lock(uniqueKey(t))
		var last uint64
		for i := 0; i < 3; i++ {
			lease := mustAcquire(t, lk)
			if lease.Fence() <= last {
				t.Fatalf("fence %d after %d", lease.Fence(), last)
			}
			last = lease.Fence()
			if lease.Key() != lk.Key() || lease.Holder() != locks.Holder() || lease.Token() == "" {
				t.Fatalf("lease names %q %q %q", lease.Key(), lease.Holder(), lease.Token())
			}
			if !lease.IsCurrent() || !lease.ValidUntil().After(time.Now()) || lease.StopBy().After(lease.ValidUntil()) {
				t.Fatalf("a fresh lease: current %v, valid until %v, stop by %v", lease.IsCurrent(), lease.ValidUntil(), lease.StopBy())
			}
			mustRelease(t, lease)
			if lease.IsCurrent() {
				t.Fatal("a released lease is current")
			}
			select {
			case <-lease.Context().Done():
			default:
				t.Fatal("a released lease's context is not cancelled")
			}
		}
	})
}

func TestTryAcquireSaysHeldWithoutError(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		a, b := connect(t, url, leasehold.WithHolder("go-a")), connect(t, url, leasehold.WithHolder("go-b"))
		key := uniqueKey(t)
		lease := mustAcquire(t, a.Lock(key))
		other, err := b.Lock(key).TryAcquire(within(t, 30*time.Second))
		if other != nil || err != nil {
			t.Fatalf("try-acquire of a held key: %v, %v", other, err)
		}
		rec, err := b.Inspect(within(t, 30*time.Second), key)
		if err != nil || rec == nil || rec.Holder == nil || *rec.Holder != "go-a" || rec.Fence != lease.Fence() {
			t.Fatalf("inspect: %+v, %v", rec, err)
		}
		mustRelease(t, lease)
		again, err := b.Lock(key).TryAcquire(within(t, 30*time.Second))
		if again == nil || err != nil {
			t.Fatalf("try-acquire of a free key: %v, %v", again, err)
		}
		mustRelease(t, again)
	})
}

func TestReleaseIsIdempotentAndForceReleaseLosesTheLease(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		locks := connect(t, url)
		key := uniqueKey(t)
		lease := mustAcquire(t, locks.Lock(key, leasehold.WithTTL(2*time.Second)))
		mustRelease(t, lease)
		mustRelease(t, lease)

		held := mustAcquire(t, locks.Lock(key, leasehold.WithTTL(900*time.Millisecond)))
		removed, err := connect(t, url).ForceRelease(within(t, 30*time.Second), key)
		if err != nil || removed == nil || removed.Fence != held.Fence() {
			t.Fatalf("force-release: %+v, %v", removed, err)
		}
		select {
		case <-held.Lost():
		case <-within(t, 20*time.Second).Done():
			t.Fatal("the lost channel did not close after a force-release")
		}
		if held.Context().Err() == nil || held.LostReason() == "" {
			t.Fatalf("after the loss: context %v, reason %q", held.Context().Err(), held.LostReason())
		}
		if err := held.Release(within(t, 30*time.Second)); !errors.Is(err, leasehold.ErrLost) {
			t.Fatalf("release of a lost lease: %v", err)
		}
	})
}

func TestTimeoutNamesTheHolder(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		key := uniqueKey(t)
		lease := mustAcquire(t, connect(t, url, leasehold.WithHolder("go-holder")).Lock(key))
		defer mustRelease(t, lease)
		_, err := connect(t, url).Lock(key, leasehold.WithWait(300*time.Millisecond)).Acquire(within(t, 30*time.Second))
		var e *leasehold.Error
		if !errors.Is(err, leasehold.ErrTimeout) || !errors.As(err, &e) {
			t.Fatalf("want a timeout, got %v", err)
		}
		if !strings.Contains(e.Holder, "go-holder") || e.Waited < 300*time.Millisecond || e.Key != key {
			t.Fatalf("timeout error: holder %q waited %s key %q", e.Holder, e.Waited, e.Key)
		}
	})
}

// A waiting Acquire whose context is cancelled leaves no waiter and no holder: the holder's
// release then leaves the key free.
func TestCancelledAcquireLeavesNothing(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		key := uniqueKey(t)
		holder := connect(t, url, leasehold.WithHolder("go-holder"))
		// A short TTL: the holder hears of a waiter at its renewals (every TTL/3).
		lease := mustAcquire(t, holder.Lock(key, leasehold.WithTTL(1500*time.Millisecond)))
		waiter := connect(t, url, leasehold.WithHolder("go-waiter"))
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			got, err := waiter.Lock(key).Acquire(ctx)
			if got != nil {
				err = errors.New("granted a held key")
			}
			done <- err
		}()
		select {
		case <-lease.HandoffRequested():
		case <-within(t, 20*time.Second).Done():
			t.Fatal("the holder never heard of the waiter")
		}
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Fatalf("a cancelled acquire: %v", err)
		}
		mustRelease(t, lease)
		rec, err := holder.Inspect(within(t, 30*time.Second), key)
		if err != nil {
			t.Fatal(err)
		}
		if rec != nil && (rec.Holder != nil || (rec.Waiter != nil && strings.Contains(*rec.Waiter, "go-waiter"))) {
			t.Fatalf("after a cancelled wait and the release: %s", rec.JSON)
		}
	})
}

// Cancels racing the grant: a waiter cancelled at spread moments around the holder's release
// either got the lease (and released it) or left nothing; the key ends free every time.
func TestCancelRacingTheGrantLeavesTheKeyFree(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		holder, waiter := connect(t, url), connect(t, url)
		for i := 0; i < 12; i++ {
			key := uniqueKey(t)
			lease := mustAcquire(t, holder.Lock(key, leasehold.WithTTL(600*time.Millisecond)))
			ctx, cancel := context.WithCancel(context.Background())
			got := make(chan *leasehold.Lease, 1)
			go func() {
				l, _ := waiter.Lock(key).Acquire(ctx)
				got <- l
			}()
			select {
			case <-lease.HandoffRequested():
			case <-within(t, 20*time.Second).Done():
				t.Fatal("the holder never heard of the waiter")
			}
			go mustRelease(t, lease)
			time.Sleep(time.Duration(i) * 300 * time.Microsecond) // the spread, not a wait for a condition
			cancel()
			if l := <-got; l != nil {
				mustRelease(t, l)
			}
			free, err := holder.Lock(key, leasehold.WithWait(5*time.Second)).Acquire(within(t, 30*time.Second))
			if err != nil {
				t.Fatalf("round %d: the key was left held: %v", i, err)
			}
			mustRelease(t, free)
		}
	})
}

func TestSemaphoreAdmitsN(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		key := uniqueKey(t)
		locks := connect(t, url)
		sem := locks.Semaphore(key, 2)
		a, b := mustAcquire(t, sem), mustAcquire(t, sem)
		if a.Fence() == b.Fence() {
			t.Fatalf("two permits with fence %d", a.Fence())
		}
		third, err := connect(t, url).Semaphore(key, 2).TryAcquire(within(t, 30*time.Second))
		if third != nil || err != nil {
			t.Fatalf("a third permit of two: %v, %v", third, err)
		}
		rec, err := locks.Inspect(within(t, 30*time.Second), key)
		if err != nil || rec.Permits == nil || rec.Permits.Kind != "semaphore" || rec.Permits.Count != 2 || len(rec.Permits.Holders) != 2 {
			t.Fatalf("inspect: %s, %v", rec.JSON, err)
		}
		mustRelease(t, a)
		c := mustAcquire(t, connect(t, url).Semaphore(key, 2))
		if c.Fence() <= b.Fence() {
			t.Fatalf("fence %d after %d", c.Fence(), b.Fence())
		}
		_, err = locks.Semaphore(key, 3).TryAcquire(within(t, 30*time.Second))
		if !errors.Is(err, leasehold.ErrInvalidInput) {
			t.Fatalf("another count for the key: %v", err)
		}
		mustRelease(t, b)
		mustRelease(t, c)
	})
}

func TestReadWrite(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		key := uniqueKey(t)
		rw1, rw2 := connect(t, url).ReadWrite(key), connect(t, url).ReadWrite(key)
		r1, r2 := mustAcquire(t, rw1.Read()), mustAcquire(t, rw2.Read())
		w, err := rw2.Write().TryAcquire(within(t, 30*time.Second))
		if w != nil || err != nil {
			t.Fatalf("a write beside readers: %v, %v", w, err)
		}
		mustRelease(t, r1)
		mustRelease(t, r2)
		w = mustAcquire(t, rw2.Write())
		if w.Fence() <= r2.Fence() || w.Fence() <= r1.Fence() {
			t.Fatalf("write fence %d after reads %d, %d", w.Fence(), r1.Fence(), r2.Fence())
		}
		r, err := rw1.Read().TryAcquire(within(t, 30*time.Second))
		if r != nil || err != nil {
			t.Fatalf("a read beside the writer: %v, %v", r, err)
		}
		mustRelease(t, w)
	})
}

func TestBadInputGivesTypedErrors(t *testing.T) {
	ctx := within(t, 30*time.Second)
	for _, url := range []string{"", "nope://x", "redis://127.0.0.1:notaport", "redis://h/0?bogus=1", "bad\x00url"} {
		if _, err := leasehold.Connect(ctx, url); !errors.Is(err, leasehold.ErrInvalidInput) {
			t.Errorf("connect %q: %v", url, err)
		}
	}
	locks := connect(t, "file://"+t.TempDir())
	for name, lk := range map[string]*leasehold.Lock{
		"empty key":      locks.Lock(""),
		"NUL in key":     locks.Lock("a\x00b"),
		"control char":   locks.Lock("a\x01b"),
		"negative TTL":   locks.Lock("k", leasehold.WithTTL(-time.Second)),
		"zero TTL":       locks.Lock("k", leasehold.WithTTL(0)),
		"renewal > TTL":  locks.Lock("k", leasehold.WithTTL(time.Second), leasehold.WithRenewEvery(2*time.Second)),
		"negative wait":  locks.Lock("k", leasehold.WithWait(-1)),
		"bad backoff":    locks.Lock("k", leasehold.WithBackoff(time.Second, time.Millisecond)),
		"zero permits":   locks.Semaphore("k", 0),
		"65 permits":     locks.Semaphore("k", 65),
		"NUL label name": locks.Lock("k", leasehold.WithLabel("a\x00", "v")),
	} {
		lease, err := lk.TryAcquire(ctx)
		if lease != nil || !errors.Is(err, leasehold.ErrInvalidInput) {
			t.Errorf("%s: %v, %v", name, lease, err)
		}
	}
	// A store that does not answer: nothing listens on the port.
	if _, err := leasehold.Connect(ctx, "redis://127.0.0.1:1"); !errors.Is(err, leasehold.ErrUnavailable) {
		t.Errorf("a store that does not answer: %v", err)
	}
}

func TestCloseEndsWaitsWithErrClosed(t *testing.T) {
	url := "file://" + t.TempDir()
	key := uniqueKey(t)
	lease := mustAcquire(t, connect(t, url).Lock(key, leasehold.WithTTL(600*time.Millisecond)))
	waiter := connect(t, url)
	done := make(chan error, 1)
	go func() {
		_, err := waiter.Lock(key).Acquire(context.Background())
		done <- err
	}()
	select {
	case <-lease.HandoffRequested():
	case <-within(t, 20*time.Second).Done():
		t.Fatal("the holder never heard of the waiter")
	}
	waiter.Close()
	if err := <-done; !errors.Is(err, leasehold.ErrClosed) {
		t.Fatalf("a wait its client's Close ended: %v", err)
	}
	if _, err := waiter.Lock(key).TryAcquire(context.Background()); !errors.Is(err, leasehold.ErrClosed) {
		t.Fatalf("a call on a closed client: %v", err)
	}
	mustRelease(t, lease)
	// The lease outlives its client's Close.
	locks := connect(t, url)
	held := mustAcquire(t, locks.Lock(key))
	locks.Close()
	if !held.IsCurrent() {
		t.Fatal("a lease stopped being current when its client closed")
	}
	mustRelease(t, held)
}

// settled waits (bounded) until the goroutine count is back to at most n.
func settled(n int) int {
	deadline := time.Now().Add(10 * time.Second)
	for {
		got := runtime.NumGoroutine()
		if got <= n || time.Now().After(deadline) {
			return got
		}
		runtime.Gosched()
		time.Sleep(10 * time.Millisecond)
	}
}

func TestNoGoroutineOrHandleLeaks(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		locks := connect(t, url)
		key := uniqueKey(t)
		before, leases := runtime.NumGoroutine(), leasehold.LiveLeases()
		ctx := context.Background()
		cycles := 1000
		if !strings.HasPrefix(url, "file:") && !strings.HasPrefix(url, "redis:") {
			cycles = 200 // the slower servers: the same check, fewer round trips
		}
		for i := 0; i < cycles; i++ {
			lease, err := locks.Lock(key).Acquire(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if i%10 == 0 {
				_ = lease.Context() // with its watcher, too
			}
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := settled(before); got > before {
			t.Fatalf("%d goroutines after %d cycles, %d before", got, cycles, before)
		}
		if got := leasehold.LiveLeases(); got > leases { // earlier tests' leases may be collected meanwhile
			t.Fatalf("%d live lease handles after %d cycles, %d before", got, cycles, leases)
		}
		// Cancelled waits.
		held := mustAcquire(t, locks.Lock(key))
		other := connect(t, url)
		before = runtime.NumGoroutine()
		for i := 0; i < 20; i++ {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
			if _, err := other.Lock(key).Acquire(ctx); !errors.Is(err, context.DeadlineExceeded) {
				t.Fatalf("a wait past its deadline: %v", err)
			}
			cancel()
		}
		if got := settled(before); got > before {
			t.Fatalf("%d goroutines after cancelled waits, %d before", got, before)
		}
		mustRelease(t, held)
	})
}

// A lease the program drops without Release is released once the garbage collector finds it
// (on the finalizer's goroutine, outside any call), long before its TTL.
func TestADroppedLeaseIsReleasedByTheCollector(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		key := uniqueKey(t)
		func() {
			lease := mustAcquire(t, connect(t, url).Lock(key, leasehold.WithTTL(time.Minute)))
			_ = lease.Context() // its watcher too must not keep it alive
		}()
		other := connect(t, url)
		deadline := time.Now().Add(20 * time.Second)
		for {
			runtime.GC()
			got, err := other.Lock(key).TryAcquire(within(t, 30*time.Second))
			if err != nil {
				t.Fatal(err)
			}
			if got != nil {
				mustRelease(t, got)
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("a dropped lease stayed held")
			}
			time.Sleep(20 * time.Millisecond) // the collector and the background release
		}
	})
}

// One lease used by many goroutines at once: reads, event channels, releases. Run under -race.
func TestOneLeaseSharedByManyGoroutines(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		locks := connect(t, url)
		key := uniqueKey(t)
		lease := mustAcquire(t, locks.Lock(key))
		start := make(chan struct{})
		errs := make(chan error, 32)
		for i := 0; i < 8; i++ {
			go func(i int) {
				<-start
				_ = lease.IsCurrent()
				_ = lease.ValidUntil()
				_ = lease.Context()
				_ = lease.Lost()
				_, _ = lease.Record()
				errs <- lease.Release(context.Background())
				_ = lease.IsCurrent()
				_ = lease.StopBy()
				_ = lease.HandoffRequested()
			}(i)
		}
		close(start)
		for i := 0; i < 8; i++ {
			if err := <-errs; err != nil {
				t.Fatalf("a concurrent release: %v", err)
			}
		}
		if lease.IsCurrent() || lease.Context().Err() == nil {
			t.Fatal("the lease is still current after its releases")
		}
		again, err := locks.Lock(key).TryAcquire(within(t, 30*time.Second))
		if again == nil || err != nil {
			t.Fatalf("the key after concurrent releases: %v, %v", again, err)
		}
		mustRelease(t, again)
	})
}
