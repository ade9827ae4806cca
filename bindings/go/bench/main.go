//go:build leaseholdbench

// Command bench measures acquire+release cycles per second from Go: this package on Redis
// beside a SET NX PX + Lua-release lock over redigo, and on etcd beside etcd's own
// concurrency.Mutex, with the Rust library's own figure (`leasehold bench`) on the same
// servers in the same run. Every worker (a goroutine) cycles on a key of its own (no
// contention), warmed by one cycle first: the figure is each client's cost per uncontended
// cycle. Rounds are interleaved; the table shows each row's median over the rounds.
//
// It imports redigo and etcd's client, which Debian packages GOPATH-style, so it sits behind
// the leaseholdbench build tag: the module's own `go vet ./...` and `go test ./...` never see
// it. scripts/go-bench installs those packages, starts the servers, builds the release library
// and the command, and runs it:
//
//	GO111MODULE=off GOPATH=$tmp:/usr/share/gocode go run -tags leaseholdbench leasehold.dev/leasehold/bench \
//	    -redis redis://127.0.0.1:6379 -etcd etcd://127.0.0.1:2379 -cli target/release/leasehold \
//	    [-seconds 2] [-rounds 3] [-concurrency 1,8] [-json]
//
// ($tmp holds src/leasehold.dev/leasehold, a link to bindings/go.)
package main

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/garyburd/redigo/redis"
	"go.etcd.io/etcd/clientv3"
	"go.etcd.io/etcd/clientv3/concurrency"

	"leasehold.dev/leasehold"
)

// ttl is every client's lease time to live, as `leasehold bench` takes its leases.
const ttl = 10 * time.Second

// The rows, in the order the table shows them.
const (
	rustRedis     = "Rust library (`leasehold bench`), tasks"
	goRedis       = "leasehold, goroutines"
	redigoRedis   = "redigo `SET NX PX` + Lua release"
	rustEtcd      = "Rust library (`leasehold bench`), tasks, etcd"
	goEtcd        = "leasehold, goroutines, etcd"
	etcdMutexEtcd = "etcd `concurrency.Mutex`, etcd"
)

var order = []string{rustRedis, goRedis, redigoRedis, rustEtcd, goEtcd, etcdMutexEtcd}

// A cycler makes one worker's cycle on key (connections are the client's, made before).
type cycler func(key string) (cycle func(ctx context.Context) error, err error)

// run is the cycles per second of n goroutines, each repeating its cycle on a key of its own
// for seconds, after one warming cycle each.
func run(ctx context.Context, n int, seconds float64, name string, newCycle cycler) (float64, error) {
	stem := randomHex(4)
	var (
		total   int64
		stop    int32
		ready   sync.WaitGroup
		done    sync.WaitGroup
		start   = make(chan struct{})
		errOnce sync.Once
		failure error
	)
	fail := func(err error) {
		errOnce.Do(func() { failure = err })
		atomic.StoreInt32(&stop, 1)
	}
	ready.Add(n)
	done.Add(n)
	for i := 0; i < n; i++ {
		go func(i int) {
			defer done.Done()
			cycle, err := newCycle(fmt.Sprintf("bench/%s/%s/%d", name, stem, i))
			if err == nil {
				err = cycle(ctx) // warm: connections made, scripts loaded
			}
			ready.Done()
			if err != nil {
				fail(err)
				return
			}
			<-start
			var count int64
			for atomic.LoadInt32(&stop) == 0 {
				if err := cycle(ctx); err != nil {
					fail(err)
					return
				}
				count++
			}
			atomic.AddInt64(&total, count)
		}(i)
	}
	ready.Wait()
	t0 := time.Now()
	close(start)
	time.Sleep(time.Duration(seconds * float64(time.Second)))
	atomic.StoreInt32(&stop, 1)
	done.Wait()
	elapsed := time.Since(t0)
	if failure != nil {
		return 0, fmt.Errorf("%s, %d workers: %w", name, n, failure)
	}
	return float64(total) / elapsed.Seconds(), nil
}

// The leasehold package: TryAcquire (the key is the worker's own) and Release.
func leaseholdCycler(locks *leasehold.Locks) cycler {
	return func(key string) (func(context.Context) error, error) {
		lock := locks.Lock(key, leasehold.WithTTL(ttl))
		return func(ctx context.Context) error {
			lease, err := lock.TryAcquire(ctx)
			if err != nil {
				return err
			}
			if lease == nil {
				return errors.New("leasehold: " + key + " is held")
			}
			return lease.Release(ctx)
		}, nil
	}
}

// The lock a Go user writes over redigo: SET key token NX PX, and a script that deletes the
// key only if it still holds the token.
var releaseScript = redis.NewScript(1, `if redis.call("get", KEYS[1]) == ARGV[1] then
	return redis.call("del", KEYS[1])
else
	return 0
end`)

func redigoCycler(pool *redis.Pool) cycler {
	return func(key string) (func(context.Context) error, error) {
		return func(context.Context) error {
			conn := pool.Get()
			defer conn.Close()
			token := randomHex(16)
			ok, err := redis.String(conn.Do("SET", key, token, "NX", "PX", int64(ttl/time.Millisecond)))
			if err != nil {
				return fmt.Errorf("redigo SET %s: %w", key, err)
			}
			if ok != "OK" {
				return errors.New("redigo: " + key + " is held")
			}
			n, err := redis.Int(releaseScript.Do(conn, key, token))
			if err != nil {
				return fmt.Errorf("redigo release %s: %w", key, err)
			}
			if n != 1 {
				return errors.New("redigo: " + key + " was not ours at release")
			}
			return nil
		}, nil
	}
}

// etcd's own mutex: Lock and Unlock under the process's one session (a lease kept alive).
func etcdMutexCycler(session *concurrency.Session) cycler {
	return func(key string) (func(context.Context) error, error) {
		return func(ctx context.Context) error {
			m := concurrency.NewMutex(session, key)
			if err := m.Lock(ctx); err != nil {
				return fmt.Errorf("etcd mutex lock %s: %w", key, err)
			}
			if err := m.Unlock(ctx); err != nil {
				return fmt.Errorf("etcd mutex unlock %s: %w", key, err)
			}
			return nil
		}, nil
	}
}

// measureLeasehold connects, runs and closes the package's client.
func measureLeasehold(ctx context.Context, url string, n int, seconds float64, name string) (float64, error) {
	locks, err := leasehold.Connect(ctx, url)
	if err != nil {
		return 0, err
	}
	defer locks.Close()
	return run(ctx, n, seconds, name, leaseholdCycler(locks))
}

func measureRedigo(ctx context.Context, url string, n int, seconds float64) (float64, error) {
	pool := &redis.Pool{
		MaxIdle: n,
		Dial:    func() (redis.Conn, error) { return redis.DialURL(url) },
	}
	defer pool.Close()
	return run(ctx, n, seconds, "redigo", redigoCycler(pool))
}

func measureEtcdMutex(ctx context.Context, url string, n int, seconds float64) (float64, error) {
	endpoint := strings.TrimPrefix(url, "etcd://")
	if i := strings.IndexAny(endpoint, "/?"); i >= 0 {
		endpoint = endpoint[:i]
	}
	client, err := clientv3.New(clientv3.Config{Endpoints: []string{endpoint}, DialTimeout: 5 * time.Second})
	if err != nil {
		return 0, fmt.Errorf("etcd client: %w", err)
	}
	defer client.Close()
	session, err := concurrency.NewSession(client, concurrency.WithTTL(int(ttl/time.Second)))
	if err != nil {
		return 0, fmt.Errorf("etcd session: %w", err)
	}
	defer session.Close()
	return run(ctx, n, seconds, "etcd-mutex", etcdMutexCycler(session))
}

// rust is the Rust library's figure for n tasks on distinct keys, from `leasehold bench`.
func rust(cli, url string, n int, seconds float64) (float64, error) {
	cmd := exec.Command(cli, "--store", url, "bench", "--tasks", strconv.Itoa(n), "--no-hot",
		"--duration", strconv.Itoa(int(seconds*1000))+"ms", "--json")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("%s bench: %w: %s", cli, err, stderr.String())
	}
	var report struct {
		Runs []struct {
			Tasks     int     `json:"tasks"`
			Keys      string  `json:"keys"`
			PerSecond float64 `json:"per_second"`
		} `json:"runs"`
	}
	if err := json.Unmarshal(out, &report); err != nil {
		return 0, fmt.Errorf("%s bench --json: %w", cli, err)
	}
	for _, r := range report.Runs {
		if r.Tasks == n && r.Keys == "distinct" {
			return r.PerSecond, nil
		}
	}
	return 0, fmt.Errorf("%s bench --json has no run of %d tasks on distinct keys", cli, n)
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // the system's random source failed: nothing to measure with
	}
	return hex.EncodeToString(b)
}

func loadAverage() float64 {
	text, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	fields := strings.Fields(string(text))
	if len(fields) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return -1
	}
	return v
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func main() {
	redisURL := flag.String("redis", "", "redis:// URL of the server (required)")
	etcdURL := flag.String("etcd", "", "etcd://HOST:PORT of the server (the etcd rows are left out without it)")
	cli := flag.String("cli", "", "the leasehold command, a release build (required)")
	seconds := flag.Float64("seconds", 2, "seconds per measurement")
	rounds := flag.Int("rounds", 3, "interleaved rounds")
	concurrency := flag.String("concurrency", "1,8", "goroutine counts, comma-separated")
	asJSON := flag.Bool("json", false, "print JSON instead of the table")
	only := flag.String("only", "", "measure only the rows whose name contains this text")
	flag.Parse()
	if *redisURL == "" || *cli == "" || *rounds < 1 || *seconds <= 0 {
		flag.Usage()
		os.Exit(2)
	}
	var levels []int
	for _, f := range strings.Split(*concurrency, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "-concurrency: %q is not a count of 1 or more\n", f)
			os.Exit(2)
		}
		levels = append(levels, n)
	}
	// A cancellable context, as a service's calls get (a request's, or signal.NotifyContext's).
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()

	figures := map[string]map[int][]float64{}
	var loads []float64
	add := func(name string, n int, f func() (float64, error)) {
		if !strings.Contains(name, *only) {
			return
		}
		v, err := f()
		if err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		if figures[name] == nil {
			figures[name] = map[int][]float64{}
		}
		figures[name][n] = append(figures[name][n], v)
	}
	for round := 0; round < *rounds; round++ {
		for _, n := range levels {
			add(rustRedis, n, func() (float64, error) { return rust(*cli, *redisURL, n, *seconds) })
			add(goRedis, n, func() (float64, error) { return measureLeasehold(ctx, *redisURL, n, *seconds, "go") })
			add(redigoRedis, n, func() (float64, error) { return measureRedigo(ctx, *redisURL, n, *seconds) })
			if *etcdURL != "" {
				add(rustEtcd, n, func() (float64, error) { return rust(*cli, *etcdURL, n, *seconds) })
				add(goEtcd, n, func() (float64, error) { return measureLeasehold(ctx, *etcdURL, n, *seconds, "go") })
				add(etcdMutexEtcd, n, func() (float64, error) { return measureEtcdMutex(ctx, *etcdURL, n, *seconds) })
			}
			loads = append(loads, loadAverage())
		}
	}
	medians := map[string]map[int]float64{}
	for name, per := range figures {
		medians[name] = map[int]float64{}
		for n, v := range per {
			medians[name][n] = median(v)
		}
	}
	sort.Float64s(loads)
	if *asJSON {
		out := map[string]interface{}{
			"load_average":      loads,
			"rounds":            *rounds,
			"seconds":           *seconds,
			"cycles_per_second": medians,
			"every_round":       figures,
		}
		if err := json.NewEncoder(os.Stdout).Encode(out); err != nil {
			fmt.Fprintln(os.Stderr, "bench:", err)
			os.Exit(1)
		}
		return
	}
	fmt.Printf("load average %.2f–%.2f (1 min, after each step); median of %d interleaved rounds of %g s\n\n",
		loads[0], loads[len(loads)-1], *rounds, *seconds)
	fmt.Print("| client | store |")
	for _, n := range levels {
		fmt.Printf(" %d × | vs Rust | vs leasehold |", n)
	}
	fmt.Print("\n|---|---|")
	for range levels {
		fmt.Print("---|---|---|")
	}
	fmt.Println()
	for _, name := range order {
		per, ok := medians[name]
		if !ok {
			continue
		}
		store, rustRow, goRow := "redis", rustRedis, goRedis
		if strings.HasSuffix(name, ", etcd") {
			store, rustRow, goRow = "etcd", rustEtcd, goEtcd
		}
		fmt.Printf("| %s | %s |", strings.TrimSuffix(name, ", etcd"), store)
		for _, n := range levels {
			fmt.Printf(" %s/s | %s | %s |", thousands(per[n]), ratio(per[n], medians[rustRow][n]), ratio(per[n], medians[goRow][n]))
		}
		fmt.Println()
	}
}

// ratio is v/base as "0.93×", or "—" without a base.
func ratio(v, base float64) string {
	if base == 0 {
		return "—"
	}
	return fmt.Sprintf("%.2f×", v/base)
}

// thousands formats v rounded, with commas (7,733).
func thousands(v float64) string {
	s := strconv.FormatInt(int64(v+0.5), 10)
	for i := len(s) - 3; i > 0; i -= 3 {
		s = s[:i] + "," + s[i:]
	}
	return s
}
