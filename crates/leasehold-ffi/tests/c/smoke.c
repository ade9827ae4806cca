/*
 * The C API used as docs/src/c.md documents it, against a real store: `smoke STORE-URL PREFIX`.
 * Prints "ok" and exits 0 when every check holds; names the failed check and exits 1 otherwise.
 * Built and run by tests/c_smoke.rs.
 */
#include "leasehold.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *prefix;

#define CHECK(cond, ...)                                                       \
  do {                                                                         \
    if (!(cond)) {                                                             \
      fprintf(stderr, "smoke.c:%d: check failed: %s: ", __LINE__, #cond);     \
      fprintf(stderr, __VA_ARGS__);                                            \
      fputc('\n', stderr);                                                     \
      exit(1);                                                                 \
    }                                                                          \
  } while (0)

/* Fails unless `got` is `want`; frees `err`. */
static void expect(int line, lh_status got, lh_status want, lh_error *err) {
  if (got != want) {
    fprintf(stderr, "smoke.c:%d: expected %s, got %s: %s\n", line,
            lh_status_name(want), lh_status_name(got),
            err ? lh_error_message(err) : "(no error)");
    exit(1);
  }
  lh_error_free(err);
}
#define EXPECT(call, want)                                                     \
  do {                                                                         \
    lh_error *err_ = NULL;                                                     \
    lh_status st_ = call;                                                      \
    expect(__LINE__, st_, want, err_);                                         \
  } while (0)
/* `call` with its error out-pointer written as ERR. */
#define ERR &err_

static char *key(const char *name) {
  static char buf[64][128];
  static int next;
  char *k = buf[next++ % 64];
  snprintf(k, 128, "%s%s", prefix, name);
  return k;
}

static lh_locks *connect_as(const char *url, const char *holder) {
  lh_connect_options *o = NULL;
  lh_locks *locks = NULL;
  EXPECT(lh_connect_options_new(&o, ERR), LH_OK);
  EXPECT(lh_connect_options_set_holder(o, holder, ERR), LH_OK);
  EXPECT(lh_locks_connect(url, o, NULL, &locks, ERR), LH_OK);
  lh_connect_options_free(o);
  CHECK(strcmp(lh_locks_holder(locks), holder) == 0, "holder %s",
        lh_locks_holder(locks));
  return locks;
}

/* Options renewing every 100 ms, so that events are seen quickly. */
static lh_lock_options *quick(void) {
  lh_lock_options *o = NULL;
  EXPECT(lh_lock_options_new(&o, ERR), LH_OK);
  EXPECT(lh_lock_options_set_ttl_ms(o, 3000, ERR), LH_OK);
  EXPECT(lh_lock_options_set_renew_every_ms(o, 100, ERR), LH_OK);
  return o;
}

static void bad_input(const char *url, lh_locks *a) {
  lh_locks *none = NULL;
  lh_lease *lease = NULL;
  lh_error *err = NULL;

  lh_status st = lh_locks_connect("nope://x", NULL, NULL, &none, &err);
  CHECK(st == LH_INVALID_URL, "%s", lh_status_name(st));
  CHECK(lh_error_code(err) == LH_INVALID_URL && none == NULL, "code");
  CHECK(strstr(lh_error_message(err), "nope://x") != NULL, "message %s",
        lh_error_message(err));
  CHECK(!lh_error_retryable(err), "an input error is not retryable");
  lh_error_free(err);

  EXPECT(lh_locks_connect(NULL, NULL, NULL, &none, ERR), LH_INVALID_ARGUMENT);
  EXPECT(lh_locks_connect(url, NULL, NULL, NULL, ERR), LH_INVALID_ARGUMENT);

  st = lh_lock_try_acquire(a, "", NULL, NULL, &lease, &err);
  CHECK(st == LH_INVALID_KEY && lease == NULL, "%s", lh_status_name(st));
  CHECK(strstr(lh_error_message(err), "invalid key") != NULL, "message %s",
        lh_error_message(err));
  lh_error_free(err);

  EXPECT(lh_rwlock_try_acquire(a, key("rw-bad"), 7, NULL, NULL, &lease, ERR),
         LH_INVALID_ARGUMENT);
  lh_lock_options *zero = NULL;
  EXPECT(lh_lock_options_new(&zero, ERR), LH_OK);
  EXPECT(lh_lock_options_set_ttl_ms(zero, 0, ERR), LH_OK);
  EXPECT(lh_lock_try_acquire(a, key("ttl0"), zero, NULL, &lease, ERR),
         LH_INVALID_OPTION);
  lh_lock_options_free(zero);
  /* A NULL err is allowed: the status alone says what happened. */
  CHECK(lh_lock_try_acquire(a, "", NULL, NULL, &lease, NULL) == LH_INVALID_KEY,
        "NULL err");
  CHECK(strcmp(lh_status_name(LH_TIMEOUT), "LH_TIMEOUT") == 0, "name");
  CHECK(strcmp(lh_status_name(999), "LH_UNKNOWN") == 0, "unknown name");
}

static void held_timeout_and_fences(lh_locks *a, lh_locks *b) {
  lh_lease *first = NULL, *none = NULL, *second = NULL;
  EXPECT(lh_lock_try_acquire(a, key("k"), NULL, NULL, &first, ERR), LH_OK);
  uint64_t f1 = lh_lease_fence(first);
  CHECK(f1 > 0, "fence");
  CHECK(strcmp(lh_lease_key(first), key("k")) == 0, "key %s", lh_lease_key(first));
  CHECK(strcmp(lh_lease_holder(first), "c-a") == 0, "holder");
  CHECK(lh_lease_is_current(first), "current");
  CHECK(lh_lease_valid_until_ns(first) > lh_monotonic_now_ns(), "valid_until");
  CHECK(lh_lease_stop_by_ns(first) < lh_lease_valid_until_ns(first), "stop_by");

  /* Held elsewhere: LH_HELD, nothing made. */
  lh_error *err = NULL;
  lh_status st = lh_lock_try_acquire(b, key("k"), NULL, NULL, &none, &err);
  CHECK(st == LH_HELD && none == NULL && err == NULL, "%s", lh_status_name(st));

  /* A wait limit: LH_TIMEOUT naming the holder and the time waited. */
  lh_lock_options *o = NULL;
  EXPECT(lh_lock_options_new(&o, ERR), LH_OK);
  EXPECT(lh_lock_options_set_wait_ms(o, 50, ERR), LH_OK);
  st = lh_lock_acquire(b, key("k"), o, NULL, &none, &err);
  CHECK(st == LH_TIMEOUT && none == NULL, "%s", lh_status_name(st));
  CHECK(strcmp(lh_error_holder(err), "c-a") == 0, "holder %s", lh_error_holder(err));
  CHECK(lh_error_waited_ms(err) >= 50, "waited %llu",
        (unsigned long long)lh_error_waited_ms(err));
  CHECK(strcmp(lh_error_key(err), key("k")) == 0, "key");
  lh_error_free(err);
  lh_lock_options_free(o);

  /* Release is idempotent; a released lease is not current, its waits end. */
  lh_release_outcome out = LH_RELEASE_LOST;
  EXPECT(lh_lease_release(first, NULL, &out, ERR), LH_OK);
  CHECK(out == LH_RELEASE_DONE, "outcome %d", (int)out);
  EXPECT(lh_lease_release(first, NULL, &out, ERR), LH_OK);
  CHECK(out == LH_RELEASE_ALREADY, "outcome %d", (int)out);
  CHECK(!lh_lease_is_current(first), "released");
  uint32_t events = 0;
  EXPECT(lh_lease_wait_event(first, LH_EVENT_LOST, -1, NULL, &events, ERR), LH_OK);
  CHECK(events == LH_EVENT_RELEASED, "events %u", events);
  lh_lease_free(first);

  EXPECT(lh_lock_try_acquire(b, key("k"), NULL, NULL, &second, ERR), LH_OK);
  CHECK(lh_lease_fence(second) > f1, "fences rise: %llu after %llu",
        (unsigned long long)lh_lease_fence(second), (unsigned long long)f1);
  EXPECT(lh_lease_release(second, NULL, NULL, ERR), LH_OK);
  lh_lease_free(second);
}

/* Two threads, each with its own client, take one key in turn. */
enum { ROUNDS = 25 };
static atomic_int inside;
static atomic_ullong last_fence;

static void *contender(void *arg) {
  lh_locks *locks = arg;
  for (int i = 0; i < ROUNDS; i++) {
    lh_lease *lease = NULL;
    EXPECT(lh_lock_acquire(locks, key("excl"), NULL, NULL, &lease, ERR), LH_OK);
    CHECK(atomic_exchange(&inside, 1) == 0, "two holders at once");
    uint64_t f = lh_lease_fence(lease);
    CHECK(f > atomic_load(&last_fence), "fence %llu after %llu",
          (unsigned long long)f, (unsigned long long)atomic_load(&last_fence));
    atomic_store(&last_fence, f);
    atomic_store(&inside, 0);
    EXPECT(lh_lease_release(lease, NULL, NULL, ERR), LH_OK);
    lh_lease_free(lease);
  }
  return NULL;
}

static void exclusion(lh_locks *a, lh_locks *b) {
  pthread_t t1, t2;
  CHECK(pthread_create(&t1, NULL, contender, a) == 0, "thread");
  CHECK(pthread_create(&t2, NULL, contender, b) == 0, "thread");
  pthread_join(t1, NULL);
  pthread_join(t2, NULL);
}

struct waiting {
  lh_locks *locks;
  lh_cancel *cancel;
  lh_status status;
  lh_lease *lease;
};

static void *wait_for_cancel(void *arg) {
  struct waiting *w = arg;
  lh_error *err = NULL;
  w->status = lh_lock_acquire(w->locks, key("cancel"), NULL, w->cancel, &w->lease, &err);
  CHECK(w->status != LH_CANCELLED || lh_error_code(err) == LH_CANCELLED, "error code");
  lh_error_free(err);
  return NULL;
}

static void cancel_from_another_thread(lh_locks *a, lh_locks *b) {
  lh_lock_options *o = quick();
  lh_lease *held = NULL;
  EXPECT(lh_lock_acquire(a, key("cancel"), o, NULL, &held, ERR), LH_OK);
  struct waiting w = {.locks = b, .status = LH_OK};
  EXPECT(lh_cancel_new(&w.cancel, ERR), LH_OK);
  pthread_t t;
  CHECK(pthread_create(&t, NULL, wait_for_cancel, &w) == 0, "thread");

  /* The holder hears of the waiter (no polling of the store). */
  uint32_t events = 0;
  EXPECT(lh_lease_wait_event(held, LH_EVENT_HANDOFF_REQUESTED, 10000, NULL, &events, ERR),
         LH_OK);
  CHECK(events == LH_EVENT_HANDOFF_REQUESTED, "events %u", events);
  char *waiter = NULL;
  EXPECT(lh_lease_handoff_waiter(held, &waiter, ERR), LH_OK);
  CHECK(waiter && strcmp(waiter, "c-b") == 0, "waiter %s", waiter ? waiter : "NULL");
  lh_string_free(waiter);

  lh_cancel_fire(w.cancel);
  pthread_join(t, NULL);
  CHECK(w.status == LH_CANCELLED && w.lease == NULL, "%s", lh_status_name(w.status));
  CHECK(lh_cancel_is_fired(w.cancel), "fired");

  /* No waiter left behind: the record names nobody but the holder. */
  char *json = NULL;
  EXPECT(lh_locks_inspect(a, key("cancel"), NULL, &json, ERR), LH_OK);
  CHECK(json != NULL, "a record");
  CHECK(strstr(json, "\"holder\":\"c-a\"") != NULL, "%s", json);
  CHECK(strstr(json, "c-b") == NULL, "the cancelled waiter is still there: %s", json);
  lh_string_free(json);

  /* A fired cancel ends other calls at once too. */
  EXPECT(lh_lease_wait_event(held, LH_EVENT_LOST, -1, w.cancel, &events, ERR), LH_CANCELLED);
  lh_cancel_free(w.cancel);

  EXPECT(lh_lease_release(held, NULL, NULL, ERR), LH_OK);
  lh_lease_free(held);
  EXPECT(lh_locks_inspect(a, key("absent"), NULL, &json, ERR), LH_OK);
  CHECK(json == NULL, "no record: %s", json);
  lh_lock_options_free(o);
}

static void lost_after_force_release(lh_locks *a, lh_locks *b) {
  lh_lock_options *o = quick();
  lh_lease *held = NULL;
  EXPECT(lh_lock_acquire(a, key("lost"), o, NULL, &held, ERR), LH_OK);
  char *removed = NULL;
  EXPECT(lh_locks_force_release(b, key("lost"), NULL, &removed, ERR), LH_OK);
  CHECK(removed && strstr(removed, "c-a"), "removed %s", removed ? removed : "NULL");
  lh_string_free(removed);

  uint32_t events = 0;
  EXPECT(lh_lease_wait_event(held, LH_EVENT_LOST | LH_EVENT_HANDOFF_REQUESTED, 10000, NULL,
                             &events, ERR),
         LH_OK);
  CHECK(events & LH_EVENT_LOST, "events %u", events);
  CHECK(!lh_lease_is_current(held), "lost is not current");
  EXPECT(lh_lease_wait_event(held, LH_EVENT_MUST_STOP, 0, NULL, &events, ERR), LH_OK);
  CHECK(events == LH_EVENT_MUST_STOP, "must stop once lost: %u", events);
  char *why = NULL;
  EXPECT(lh_lease_lost_reason(held, &why, ERR), LH_OK);
  CHECK(why != NULL, "a reason");
  lh_string_free(why);

  lh_error *err = NULL;
  lh_release_outcome out = LH_RELEASE_DONE;
  lh_status st = lh_lease_release(held, NULL, &out, &err);
  CHECK(st == LH_LOST && out == LH_RELEASE_LOST, "%s", lh_status_name(st));
  CHECK(lh_error_code(err) == LH_LOST, "code");
  lh_error_free(err);
  lh_lease_free(held);
  lh_lock_options_free(o);
}

static void permits(lh_locks *a, lh_locks *b) {
  lh_lease *s1 = NULL, *s2 = NULL, *s3 = NULL;
  EXPECT(lh_semaphore_acquire(a, key("sem"), 2, NULL, NULL, &s1, ERR), LH_OK);
  EXPECT(lh_semaphore_acquire(b, key("sem"), 2, NULL, NULL, &s2, ERR), LH_OK);
  CHECK(lh_lease_fence(s2) > lh_lease_fence(s1), "semaphore fences rise");
  EXPECT(lh_semaphore_try_acquire(a, key("sem"), 2, NULL, NULL, &s3, ERR), LH_HELD);
  EXPECT(lh_semaphore_try_acquire(a, key("sem"), 3, NULL, NULL, &s3, ERR), LH_INVALID_OPTION);
  EXPECT(lh_lease_release(s1, NULL, NULL, ERR), LH_OK);
  EXPECT(lh_semaphore_try_acquire(a, key("sem"), 2, NULL, NULL, &s3, ERR), LH_OK);
  lh_lease *all[] = {s2, s3};
  for (int i = 0; i < 2; i++) {
    EXPECT(lh_lease_release(all[i], NULL, NULL, ERR), LH_OK);
    lh_lease_free(all[i]);
  }
  lh_lease_free(s1);

  lh_lease *r1 = NULL, *r2 = NULL, *w = NULL;
  EXPECT(lh_rwlock_acquire(a, key("rw"), LH_RW_READ, NULL, NULL, &r1, ERR), LH_OK);
  EXPECT(lh_rwlock_acquire(b, key("rw"), LH_RW_READ, NULL, NULL, &r2, ERR), LH_OK);
  EXPECT(lh_rwlock_try_acquire(b, key("rw"), LH_RW_WRITE, NULL, NULL, &w, ERR), LH_HELD);
  EXPECT(lh_lease_release(r1, NULL, NULL, ERR), LH_OK);
  EXPECT(lh_lease_release(r2, NULL, NULL, ERR), LH_OK);
  EXPECT(lh_rwlock_acquire(b, key("rw"), LH_RW_WRITE, NULL, NULL, &w, ERR), LH_OK);
  CHECK(lh_lease_fence(w) > lh_lease_fence(r2), "fences rise across reads and writes");
  EXPECT(lh_rwlock_try_acquire(a, key("rw"), LH_RW_READ, NULL, NULL, &r1, ERR), LH_HELD);
  EXPECT(lh_lease_release(w, NULL, NULL, ERR), LH_OK);
  lh_lease_free(w);
  lh_lease_free(r2);
}

static void freed_without_release(lh_locks *a, lh_locks *b) {
  lh_lease *dropped = NULL, *next = NULL;
  EXPECT(lh_lock_try_acquire(a, key("free"), NULL, NULL, &dropped, ERR), LH_OK);
  lh_lease_free(dropped); /* released in the background */
  lh_lock_options *o = NULL;
  EXPECT(lh_lock_options_new(&o, ERR), LH_OK);
  EXPECT(lh_lock_options_set_wait_ms(o, 10000, ERR), LH_OK);
  EXPECT(lh_lock_options_add_label(o, "task", "42", ERR), LH_OK);
  EXPECT(lh_lock_acquire(b, key("free"), o, NULL, &next, ERR), LH_OK);
  char *json = NULL;
  EXPECT(lh_lease_record_json(next, &json, ERR), LH_OK);
  CHECK(strstr(json, "\"task\":\"42\"") != NULL, "labels: %s", json);
  lh_string_free(json);
  EXPECT(lh_lease_release(next, NULL, NULL, ERR), LH_OK);
  lh_lease_free(next);
  lh_lock_options_free(o);
}

/* A child forked after the runtime started is refused, not left hanging. */
static void forked_child(lh_locks *a) {
  pid_t pid = fork();
  CHECK(pid >= 0, "fork");
  if (pid == 0) {
    lh_lease *lease = NULL;
    lh_error *err = NULL;
    lh_status st = lh_lock_try_acquire(a, key("fork"), NULL, NULL, &lease, &err);
    int refused = st == LH_FORKED && lh_error_code(err) == LH_FORKED && lease == NULL;
    lh_error_free(err);
    _exit(refused ? 0 : 1);
  }
  int status = 0;
  CHECK(waitpid(pid, &status, 0) == pid, "waitpid");
  CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the child was not refused: %d", status);
}

int main(int argc, char **argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: smoke STORE-URL KEY-PREFIX\n");
    return 2;
  }
  const char *url = argv[1];
  prefix = argv[2];
  CHECK(strlen(lh_version()) > 0, "version");
  lh_locks *a = connect_as(url, "c-a");
  lh_locks *b = connect_as(url, "c-b");

  bad_input(url, a);
  held_timeout_and_fences(a, b);
  exclusion(a, b);
  cancel_from_another_thread(a, b);
  lost_after_force_release(a, b);
  permits(a, b);
  freed_without_release(a, b);
  forked_child(a);

  uint64_t left = 1;
  EXPECT(lh_settle(5000, &left, ERR), LH_OK);
  CHECK(left == 0, "background work left: %llu", (unsigned long long)left);
  lh_locks_free(a);
  lh_locks_free(b);
  puts("ok");
  return 0;
}
