package agentlocks_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"leasehold.dev/leasehold"
	"leasehold.dev/leasehold/examples/agentlocks"
	"leasehold.dev/leasehold/internal/testenv"
)

// TestHelperPod is not a test: it is a pod (this test binary run again) when
// LEASEHOLD_GO_POD is set, serving the agents named there until SIGTERM.
func TestHelperPod(t *testing.T) {
	spec := os.Getenv("LEASEHOLD_GO_POD")
	if spec == "" {
		return
	}
	parts := strings.SplitN(spec, "|", 2)
	err := agentlocks.Serve(parts[0], strings.Split(parts[1], ","),
		func(ctx context.Context, id string, fence uint64) { <-ctx.Done() },
		func(started []string) { fmt.Printf("started %s\n", strings.Join(started, ",")) })
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	os.Exit(0)
}

type pod struct {
	cmd     *exec.Cmd
	started []string
}

func startPod(t *testing.T, url string, agents []string) *pod {
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperPod$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("LEASEHOLD_GO_POD=%s|%s", url, strings.Join(agents, ",")))
	cmd.Stderr = os.Stderr
	out, _ := cmd.StdoutPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || !strings.HasPrefix(line, "started ") {
		t.Fatalf("the pod said %q: %v", line, err)
	}
	var started []string
	if s := strings.TrimSpace(strings.TrimPrefix(line, "started ")); s != "" {
		started = strings.Split(s, ",")
	}
	return &pod{cmd: cmd, started: started}
}

// Two pods over one Redis: each agent runs in one of them; SIGTERM to the first releases every
// lock it held at once (not after the 30 s TTL), so the second pod's restart takes them all.
func TestEveryAgentInOnePodAndReleasedOnSIGTERM(t *testing.T) {
	url := testenv.URL(t, "LEASEHOLD_TEST_REDIS")
	stem := fmt.Sprintf("%d", time.Now().UnixNano())
	var agents []string
	for i := 0; i < 8; i++ {
		agents = append(agents, fmt.Sprintf("%s-%d", stem, i))
	}
	first := startPod(t, url, agents)
	if len(first.started) != len(agents) {
		t.Fatalf("the first pod started %v", first.started)
	}
	second := startPod(t, url, agents)
	if len(second.started) != 0 {
		t.Fatalf("the second pod started %v while the first runs them", second.started)
	}
	terminated := time.Now()
	if err := first.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := first.cmd.Wait(); err != nil {
		t.Fatalf("the first pod's shutdown: %v", err)
	}
	took := time.Since(terminated)
	if took > agentlocks.ShutdownLimit {
		t.Fatalf("shutdown took %s", took)
	}
	locks, err := leasehold.Connect(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	for _, id := range agents {
		rec, err := locks.Inspect(context.Background(), "agent/"+id)
		if err != nil {
			t.Fatal(err)
		}
		if rec != nil && rec.Holder != nil {
			t.Fatalf("agent %s still held %s after the pod's SIGTERM: %s", id, time.Since(terminated), rec.JSON)
		}
	}
	second.cmd.Process.Signal(syscall.SIGTERM)
	second.cmd.Wait()
	third := startPod(t, url, agents)
	if len(third.started) != len(agents) {
		t.Fatalf("a pod started after the others stopped took %v", third.started)
	}
	third.cmd.Process.Signal(syscall.SIGTERM)
	if err := third.cmd.Wait(); err != nil {
		t.Fatal(err)
	}
}

// An agent whose lock is lost (force-released here) is stopped by its context.
func TestAnAgentStopsWhenItsLockIsLost(t *testing.T) {
	url := testenv.URL(t, "LEASEHOLD_TEST_REDIS")
	ctx := context.Background()
	locks, err := leasehold.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer locks.Close()
	m := agentlocks.NewManager(locks)
	m.TTL, m.RenewEvery = 1500*time.Millisecond, time.Second // the loss is seen at a renewal
	id := fmt.Sprintf("lost-%d", time.Now().UnixNano())
	stopped := make(chan struct{})
	if err := m.StartAgent(ctx, id, func(ctx context.Context, fence uint64) {
		<-ctx.Done()
		close(stopped)
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := locks.ForceRelease(ctx, "agent/"+id); err != nil {
		t.Fatal(err)
	}
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the agent ran on after its lock was lost")
	}
	if err := m.StopAgent(ctx, id); err == nil {
		t.Fatal("releasing a lost lock said nothing")
	}
}
