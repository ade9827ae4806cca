package leasehold_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"leasehold.dev/leasehold"
)

// TestHelperWorker is not a test: it is the worker the multi-process test runs as a separate
// process (this test binary run again), when LEASEHOLD_GO_WORKER is set.
func TestHelperWorker(t *testing.T) {
	spec := os.Getenv("LEASEHOLD_GO_WORKER")
	if spec == "" {
		return
	}
	parts := strings.SplitN(spec, "|", 4)
	url, key, dir := parts[0], parts[1], parts[2]
	cycles, _ := strconv.Atoi(parts[3])
	if err := work(url, key, dir, cycles); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(3)
	}
	os.Exit(0)
}

// work takes key cycles times; inside, it makes dir/inside exclusively (another process
// inside at once would already have it) and logs its fence.
func work(url, key, dir string, cycles int) error {
	ctx := context.Background()
	locks, err := leasehold.Connect(ctx, url)
	if err != nil {
		return err
	}
	defer locks.Close()
	log, err := os.Create(filepath.Join(dir, fmt.Sprintf("fences-%d", os.Getpid())))
	if err != nil {
		return err
	}
	defer log.Close()
	for i := 0; i < cycles; i++ {
		lease, err := locks.Lock(key, leasehold.WithTTL(5*time.Second)).Acquire(ctx)
		if err != nil {
			return err
		}
		inside := filepath.Join(dir, "inside")
		f, err := os.OpenFile(inside, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
		if err != nil {
			return fmt.Errorf("another process was inside with us (fence %d): %w", lease.Fence(), err)
		}
		f.Close()
		fmt.Fprintln(log, lease.Fence())
		time.Sleep(time.Millisecond) // the critical section's work
		if !lease.IsCurrent() {
			return errors.New("the lease stopped being current inside")
		}
		if err := os.Remove(inside); err != nil {
			return err
		}
		if err := lease.Release(ctx); err != nil {
			return err
		}
	}
	return nil
}

func TestTwoProcessesNeverOverlap(t *testing.T) {
	forEachStore(t, func(t *testing.T, url string) {
		key, dir, cycles := uniqueKey(t), t.TempDir(), 25
		var procs []*exec.Cmd
		for i := 0; i < 2; i++ {
			cmd := exec.Command(os.Args[0], "-test.run=^TestHelperWorker$")
			cmd.Env = append(os.Environ(), fmt.Sprintf("LEASEHOLD_GO_WORKER=%s|%s|%s|%d", url, key, dir, cycles))
			cmd.Stderr = os.Stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			procs = append(procs, cmd)
		}
		for _, cmd := range procs {
			if err := cmd.Wait(); err != nil {
				t.Fatalf("a worker failed (exit 3: two inside at once): %v", err)
			}
		}
		var all []uint64
		logs, _ := filepath.Glob(filepath.Join(dir, "fences-*"))
		for _, name := range logs {
			text, err := os.ReadFile(name)
			if err != nil {
				t.Fatal(err)
			}
			var last uint64
			for _, line := range strings.Fields(string(text)) {
				f, _ := strconv.ParseUint(line, 10, 64)
				if f <= last {
					t.Fatalf("%s: fence %d after %d", name, f, last)
				}
				last = f
				all = append(all, f)
			}
		}
		sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
		if len(all) != 2*cycles {
			t.Fatalf("%d sections logged, want %d", len(all), 2*cycles)
		}
		for i := 1; i < len(all); i++ {
			if all[i] == all[i-1] {
				t.Fatalf("fence %d handed out twice", all[i])
			}
		}
	})
}

// cli is the leasehold command the test command names in LEASEHOLD_CLI.
func cli(t *testing.T) string {
	bin := os.Getenv("LEASEHOLD_CLI")
	if bin == "" {
		if os.Getenv("LEASEHOLD_TEST_REQUIRE_ALL") == "1" {
			t.Fatal("LEASEHOLD_CLI is not set: the test command names the leasehold command there")
		}
		t.Skip("LEASEHOLD_CLI (the leasehold command) is not set")
	}
	return bin
}

func TestGoAndCommandHoldersExcludeEachOther(t *testing.T) {
	bin := cli(t)
	forEachStore(t, func(t *testing.T, url string) {
		key := uniqueKey(t)
		locks := connect(t, url)
		lease := mustAcquire(t, locks.Lock(key))
		out, err := exec.Command(bin, "run", "--store", url, "--key", key, "--no-wait", "--", "true").CombinedOutput()
		var exit *exec.ExitError
		if !errors.As(err, &exit) || exit.ExitCode() != 75 {
			t.Fatalf("leasehold run on a key Go holds: %v: %s", err, out)
		}
		mustRelease(t, lease)

		cmd := exec.Command(bin, "run", "--store", url, "--key", key, "--", "sh", "-c", "echo inside; read line || true")
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		line, err := bufio.NewReader(stdout).ReadString('\n')
		if err != nil || line != "inside\n" {
			t.Fatalf("the command under leasehold run: %q, %v", line, err)
		}
		if got, err := locks.Lock(key).TryAcquire(within(t, 30*time.Second)); got != nil || err != nil {
			t.Fatalf("Go took a key leasehold run holds: %v, %v", got, err)
		}
		stdin.Close()
		if err := cmd.Wait(); err != nil {
			t.Fatalf("leasehold run: %v", err)
		}
		after, err := locks.Lock(key).TryAcquire(within(t, 30*time.Second))
		if after == nil || err != nil {
			t.Fatalf("the key after leasehold run released it: %v, %v", after, err)
		}
		if after.Fence() <= lease.Fence()+1 {
			t.Fatalf("fence %d after Go's %d and the command's", after.Fence(), lease.Fence())
		}
		mustRelease(t, after)
	})
}

// proxy sends a command ("pause", "resume") to the test kit's proxy in front of Redis.
func proxy(t *testing.T, command string) {
	addr := os.Getenv("LEASEHOLD_TEST_PROXY")
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("the proxy's control at %q: %v", addr, err)
	}
	defer conn.Close()
	fmt.Fprintln(conn, command)
	if reply, err := bufio.NewReader(conn).ReadString('\n'); err != nil || reply != "ok\n" {
		t.Fatalf("the proxy answered %q to %s: %v", reply, command, err)
	}
}

// A holder cut off from its store: its Context is cancelled before another process is granted
// the key.
func TestContextEndsBeforeAnotherIsGrantedWhenCutOff(t *testing.T) {
	proxied, direct := os.Getenv("LEASEHOLD_TEST_REDIS_PROXIED"), os.Getenv("LEASEHOLD_TEST_REDIS")
	if proxied == "" || direct == "" || os.Getenv("LEASEHOLD_TEST_PROXY") == "" {
		if os.Getenv("LEASEHOLD_TEST_REQUIRE_ALL") == "1" {
			t.Fatal("LEASEHOLD_TEST_REDIS_PROXIED, LEASEHOLD_TEST_REDIS or LEASEHOLD_TEST_PROXY is not set")
		}
		t.Skip("needs Redis behind the test kit's proxy")
	}
	key := uniqueKey(t)
	lease := mustAcquire(t, connect(t, proxied).Lock(key, leasehold.WithTTL(1500*time.Millisecond)))
	stopped := make(chan time.Time, 1)
	go func() {
		<-lease.Context().Done()
		stopped <- time.Now()
	}()
	proxy(t, "pause")
	defer proxy(t, "resume")
	other := connect(t, direct)
	ctx := within(t, 20*time.Second)
	var granted time.Time
	for {
		got, err := other.Lock(key).TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if got != nil {
			granted = time.Now()
			defer mustRelease(t, got)
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the other process's view of the key
	}
	select {
	case at := <-stopped:
		if !at.Before(granted) {
			t.Fatalf("the holder's context ended %s after another was granted", at.Sub(granted))
		}
		t.Logf("the holder's context ended %s before another was granted", granted.Sub(at))
	default:
		t.Fatal("another was granted the key while the cut-off holder's context was live")
	}
}
