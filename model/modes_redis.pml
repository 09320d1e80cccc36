/* modes_redis.pml: redislock's shared and limited locks and writer
 * preference (the Lua scripts of redislock/redisproto/lua).
 *
 * Mirrors:
 *   acquire_group.lua  a shared or limited attempt, branch by branch: a
 *                      group holding the key (purge_holders, then the mode,
 *                      the limit, live_writers), a group whose holders all
 *                      ended, an exclusive lease, a free key or a release
 *                      marker (a reservation for another waiter; for this
 *                      reader while a writer is registered: handed on by
 *                      wake_unhanded, the reader queued again from
 *                      HandedOn)
 *   acquire.lua        an exclusive attempt of a blocking Acquire: refused,
 *                      it queues the waiter and registers it as a waiting
 *                      writer (register_writer); granted, it removes both
 *   release_group.lua  a group holder's release: the last one leaves the
 *                      release marker and wake_one reserves the key for the
 *                      first queued waiter still listening
 *   release.lua        the exclusive release (marker, wake_one)
 *   leave.lua          a writer that gave up withdraws its registration
 *   helpers.lua        purge_holders, live_writers, register_writer,
 *                      queue_waiter (ZADD NX scored by the attempt's
 *                      time, or HandedOn + it for a reader that handed a
 *                      reservation on: a queued waiter keeps its place,
 *                      one popped goes last among the waiters scored
 *                      below HandedOn, or last of all), wake_one (pops the
 *                      first listening waiter, in score order, and
 *                      reserves the key for it), wake_unhanded (wake_one
 *                      among the waiters scored below HandedOn)
 *   keys.go            HandedOn, above every score that is a clock
 *   Redis expiry       a lease's end (PX), the group's keys at the latest
 *                      holder's expiry (group_expire), a registration's end
 *                      (register_writer's PEXPIREAT), a reservation's end
 *
 * Timing, as the order the design relies on: each script is one atomic
 * step on one server (standalone). A holder's Lost() closes before its
 * lease can end on the server (the drift allowance), so a lease that ends
 * (a pause past the TTL, a crash, a cut link) ends the holder's use and
 * then its server-side lease, in one step. A waiting writer attempts again
 * well within its registration's TTL (the core's TTL/3), so a registration
 * expires only once its writer stopped attempting (crashed, or gave up and
 * its Leave not yet run). A woken waiter attempts within its reservation
 * (100ms, against a round trip) unless env makes it slow. A reservation
 * for a waiter that left, a group whose holders all ended, a dead
 * writer's registration: each ends at some later point (a forced step of
 * process clock). The clients' clocks agree (the queue's scores are their
 * time.Now(); a skew reorders only the waiters scored below HandedOn, and
 * the model checks that harmless with the readers ahead of the writer:
 * mutant 2 is what it did before 6bad220). A refused waiter attempts
 * again at some later point, and only a new attempt can change its
 * answer: the model lets it attempt once the server's state changed since
 * its last attempt (at the lease end it was told of, a wake-up or its
 * backoff, whichever comes first: none is faster than a change).

 * Environment (process env, optional, at most EVENTS_MAX events): a
 * holder's lease ends; a waiter gives up (its context ended; a writer's
 * Leave follows, after it stopped listening) or crashes (a writer's
 * registration then stays until it expires); a woken waiter is too slow
 * for its reservation. X, an exclusive holder from before the clients
 * start (present or not), releases (release.lua) or its lease ends.
 *
 * Abstracted away: tokens, markers' tokens and receipts (guard.pml covers
 * fences), metadata, owners reused across attempts and lost replies (an
 * attempt or release executed twice), renewals (refresh_group extends a
 * live holder: the model keeps it live until it releases or env ends its
 * lease; a renewal after the lease ended returns 0 and changes nothing),
 * the wake-ups that only make a waiter attempt sooner (wake_one's PUBLISH,
 * poke_first, poke_from and the pk key, pass_permit: see Timing, every
 * refused waiter attempts again), departed waiters left queued (wake_one
 * skips them on a standalone server: the model dequeues at once), Cluster
 * (PUBLISH counts), limits other than LIMIT (ErrLimitMismatch),
 * TryAcquire (an Acquire that gives up), Break, the Lua-free protocol.
 * Each client makes one acquisition: client 0 as a writer (a blocking
 * exclusive Acquire) or a permit, 1 and 2 as readers or permits; one
 * writer registration (client 0's).
 *
 * Properties:
 *   limit:   at most LIMIT permit holders; modes never mix (assertions at
 *            each grant: holds only end afterwards);
 *   writer:  writer preference as docs/redislock.md promises it: while a
 *            blocking exclusive Acquire that has been refused still waits,
 *            no new shared holder is granted (readers already holding keep
 *            their leases; permits are not held back);
 *   refuse:  no waiter refused while it could be granted: a refusal has a
 *            cause (a live incompatible holder, all permits held, a live
 *            writer registration for a shared request, the key reserved
 *            for another waiter);
 *   live:    no waiter stranded: every waiter is eventually granted or
 *            gives up (ltl, weak fairness; also asserted when nothing can
 *            move); and no busy loop: the hand-ons since a release (the
 *            reservation it made passed on by readers, a writer
 *            registered) are at most the waiters queued since (at the
 *            release or after it, a hand-on's re-queue aside): each gets
 *            it once, whether the registered writer still waits or died
 *            waiting (assertion on ghost counts).
 */
#ifndef MUTANT
#define MUTANT 0
#endif
//@ mutant 1 a release's reservation skips the writer-preference check: the reader the release woke is granted while a writer waits
//@ mutant 2 (environment, before 6bad220) the readers' clocks are behind the writer's: re-queued readers go back ahead of it, and two readers pass the reservation between them for ever while it waits
//@ mutant 3 a limited acquire counts the permits recorded, expired ones too (no purge_holders): a permit waiter is refused with a permit free
//@ mutant 4 a limited acquire refuses only above the limit (n > limit): one permit too many
//@ mutant 5 a writer's registration never expires (no PEXPIREAT): a crashed writer keeps readers out for ever
//@ mutant 6 before 6bad220: a reader that hands a reservation on re-queues at its arrival score and the hand-on wakes the lowest-scored waiter: readers behind a dead writer hand it back and forth

#define NC 3          /* clients */
#define LIMIT 2       /* permits */
#define NONE 9
#define EVENTS_MAX 2  /* environment events in all */

/* modes */
#define EX 1
#define SH 2
#define LM 3

/* the key's value */
#define FREE 0        /* no value, or a release marker */
#define EXCL 2        /* an exclusive lease (client 0's or X's) */
#define GRP 3         /* a group's "*<mode>|<token>|<limit>" */

/* a client's phase */
#define IDLE 0
#define WAITING 1     /* in its Acquire: attempts, refused ones queue it */
#define HELD 2
#define LEAVE 3       /* a writer that gave up: its Leave is yet to run */
#define DONE 4

/* Redis */
byte kind = FREE;
byte gm;              /* the group's mode */
byte hs[NC];          /* P:{T}:h: 0 no entry, 1 live, 2 recorded, lease ended */
byte resv = NONE;     /* the marker's reservation: the waiter it is for */
bool wr;              /* P:{T}:wr holds client 0's registration */
byte wq[NC];          /* P:{T}:waiters: wait ids, lowest score first */
byte wn;              /* how many */
bool hq[NC];          /* c is queued scored from HandedOn (the tail of wq) */

/* The clients. */
byte md[NC];
byte ph[NC];
bool chg[NC];         /* the server's state changed since c's last attempt */
bool wref;            /* ghost: writer 0 was refused in its Acquire */
bool xh;              /* X, an exclusive holder from before, holds the key */
byte ev = EVENTS_MAX;
byte hops;            /* ghost: hand-ons since the release that reserved the key */
byte seen;            /* ghost: the waiters queued since then (at the release or
                       * after it; not a hand-on's re-queue) */

/* Scratch for the d_steps (reset after use). */
byte i, n, r, x, y;

#define waiting(c) (ph[c] == WAITING)

inline changed() {
  chg[0] = true; chg[1] = true; chg[2] = true
}

/* queue_waiter: ZADD NX, scored by the attempt's time (h = 0), or by
 * HandedOn + that time (h = 1: a reader that handed a reservation on;
 * hq[c] records which): a waiter already queued keeps its place and
 * score; one not queued (popped by wake_one or wake_unhanded) goes last
 * among the waiters scored below HandedOn (h = 0), or last of all (h = 1).
 * While a reservation is out, a waiter so queued counts in seen if g
 * (not a hand-on's re-queue). */
inline queue_waiter(c, h, g) {
  i = 0;
  do
  :: i < wn && wq[i] != c -> i++
  :: else -> break
  od;
  if
  :: i == wn ->
     x = 0;                                      /* where c goes */
     if
     :: h -> x = wn
     :: else ->
        do
        :: x < wn && !hq[wq[x]] -> x++
        :: else -> break
        od;
#if MUTANT == 2
        if
        :: md[c] == SH && md[0] == EX ->         /* a lower score than the writer's */
           i = 0;
           do
           :: i < x && wq[i] != 0 -> i++
           :: else -> break
           od;
           x = i; i = wn
        :: else
        fi;
#endif
     fi;
     if :: g && resv != NONE -> seen++ :: else fi;
     do
     :: i > x -> wq[i] = wq[i - 1]; i--
     :: else -> break
     od;
     wq[x] = c; hq[c] = h; wn++; x = 0
  :: else
  fi;
  i = 0
}

/* ZREM waiters c */
inline dequeue(c) {
  i = 0;
  do
  :: i < wn && wq[i] != c -> i++
  :: else -> break
  od;
  if
  :: i < wn ->
     do
     :: i + 1 < wn -> wq[i] = wq[i + 1]; i++
     :: else -> break
     od;
     wn--; wq[wn] = 0; hq[c] = 0
  :: else
  fi;
  i = 0
}

/* wake_one: pop queued waiters, lowest score first, until one listens
 * (PUBLISH counts it); y = the one the key is reserved for (NONE if
 * none). Departed waiters are dequeued as they leave (see Abstracted
 * away): the first one listens. */
inline wake_one() {
  if
  :: wn > 0 -> y = wq[0]; dequeue(y)
  :: else -> y = NONE
  fi
}

/* wake_unhanded: wake_one among the waiters scored below HandedOn. */
inline wake_unhanded() {
  if
  :: wn > 0 && !hq[wq[0]] -> y = wq[0]; dequeue(y)
  :: else -> y = NONE
  fi
}

/* A release (release.lua, release_group.lua): the key is free, wake_one
 * reserves it for the first queued waiter; the ghosts start counting. */
inline release_wake() {
  kind = FREE; hops = 0; seen = wn;
  wake_one(); resv = y; y = 0;
  if :: resv == NONE -> seen = 0 :: else fi
}

/* The reservation is gone (taken, handed to no one, or ended): no hand-on
 * until the next release, whose ghosts start afresh. */
inline unreserve() {
  resv = NONE; hops = 0; seen = 0
}

/* purge_holders: drop the entries whose lease ended. */
inline purge() {
  i = 0;
  do
  :: i < NC -> if :: hs[i] == 2 -> hs[i] = 0 :: else fi; i++
  :: else -> break
  od;
  i = 0
}

/* n = the live entries (#hs / 3 after group_holders). */
inline live_count() {
  n = 0; i = 0;
  do
  :: i < NC -> if :: hs[i] == 1 -> n++ :: else fi; i++
  :: else -> break
  od;
  i = 0
}

#if MUTANT == 3
/* ZCARD without the purge: expired entries count */
inline recorded_count() {
  n = 0; i = 0;
  do
  :: i < NC -> if :: hs[i] != 0 -> n++ :: else fi; i++
  :: else -> break
  od;
  i = 0
}
#endif

/* refuse: c could not have been granted (property refuse). */
inline check_refusal(c) {
  live_count();
  x = (kind != FREE || resv == NONE || resv == c) && kind != EXCL;
  if
  :: md[c] == EX -> x = x && n == 0
  :: md[c] == SH -> x = x && (n == 0 || gm == SH) && !wr
  :: md[c] == LM -> x = x && (n == 0 || (gm == LM && n < LIMIT))
  fi;
  assert(!x);
  x = 0; n = 0
}

/* limit and writer, as c is granted. */
inline check_grant(c) {
  i = 0; n = 0;
  do
  :: i < NC ->
     if
     :: ph[i] == HELD ->
        assert(i == c || (md[i] != EX && md[c] != EX && md[i] == md[c]));
        if :: md[i] == LM -> n++ :: else fi
     :: else
     fi;
     i++
  :: else -> break
  od;
  assert(n <= LIMIT);
  /* writer: no new reader while a refused writer waits */
  assert(!(md[c] == SH && md[0] == EX && waiting(0) && wref));
  i = 0; n = 0
}

/* acquire_group.lua, for client c (mode md[c], with a wait id: it
 * waits): r = 1 if refused, 2 if refused and queued already. */
inline acquire_group(c) {
  if
  :: kind == GRP ->
#if MUTANT == 3
     if :: md[c] == LM -> recorded_count() :: else -> purge(); live_count() fi;
#else
     purge(); live_count();                    /* group_holders */
#endif
     if
     :: n > 0 ->
        if
#if MUTANT == 4
        :: gm != md[c] || (gm == LM && n > LIMIT) -> r = 1
#else
        :: gm != md[c] || (gm == LM && n >= LIMIT) -> r = 1   /* {0, v, most, hs} */
#endif
        :: md[c] == SH && wr -> r = 1                         /* {3, most, hs} */
        :: else
        fi
     :: else ->
        purge();                                              /* DEL h, hd */
        if
        :: md[c] == SH && wr -> r = 1                         /* {3, 0, {}} */
        :: else
        fi
     fi
  :: kind == EXCL -> r = 1                                    /* {0, v, pttl} */
  :: kind == FREE ->
     if
     :: resv != NONE && resv != c -> r = 1                    /* reserved_left > 0 */
#if MUTANT == 1
     :: md[c] == SH && wr && resv != c -> r = 1
#else
     :: md[c] == SH && wr ->
        if
        :: resv == c ->                                       /* hand it on */
#if MUTANT == 2 || MUTANT == 6
           /* Before 6bad220: a writer registered but not queued and not
            * listening (crashed or cut off while refused, or gave up with
            * its Leave not run) was never reached: two readers queued
            * behind the reservation passed it back and forth, each woken
            * at once by the other's PUBLISH, a script per round trip
            * until the registration expired (up to a TTL; reproduced on
            * redis-server: 3853 scripts in 300ms). */
           wake_one(); resv = y; y = 0;
#else
           wake_unhanded(); resv = y; y = 0;
#endif
           changed();
           /* live: no busy loop: a hand-on reaches each waiter queued
            * since the release once, whether the writer still waits or
            * not (its registration outlives it: crashed, or its Leave
            * not yet run). */
           hops++; assert(hops <= seen);
           if :: resv == NONE -> unreserve() :: else fi;
#if MUTANT == 2 || MUTANT == 6
           queue_waiter(c, 0, 0);
#else
           queue_waiter(c, 1, 0);
#endif
           r = 2
        :: else -> r = 1
        fi                                                    /* {3, 0, {}} */
#endif
     :: else
     fi
  fi;
  n = 0
}

/* acquire.lua, client 0's blocking exclusive attempt: r = 1 if refused. */
inline acquire_excl(c) {
  if
  :: kind == GRP ->
     purge(); live_count();                    /* group_holders */
     if
     :: n > 0 -> r = 1                         /* {0, v, most, hs} */
     :: else                                   /* every holder's lease ended */
     fi
  :: kind == EXCL -> r = 1
  :: kind == FREE && resv != NONE && resv != c -> r = 1   /* reserved_left */
  :: else
  fi;
  n = 0
}

/* One attempt of client c, by the script of its mode. A refused one is
 * queued (queue_waiter), and a writer's registered (register_writer); a
 * granted one is dequeued, and a writer's registration removed. */
inline attempt(c) {
  r = 0;
  if
  :: md[c] == EX -> acquire_excl(c)
  :: else -> acquire_group(c)
  fi;
  if
  :: r ->
     check_refusal(c);
     if :: r == 1 -> queue_waiter(c, 0, 1) :: else fi;
     if :: md[c] == EX -> wr = true; wref = true :: else fi
  :: else ->
     if
     :: md[c] == EX -> kind = EXCL; wr = false
     :: else -> kind = GRP; gm = md[c]; hs[c] = 1
     fi;
     if :: kind == EXCL -> hs[0] = 0; hs[1] = 0; hs[2] = 0 :: else fi;  /* DEL h, hd */
     unreserve();              /* SET over the marker */
     dequeue(c);               /* ZREM waiters */
     ph[c] = HELD;
     changed();
     check_grant(c)
  fi;
  r = 0
}

/* release_group.lua (c holds: its entry is live). */
inline release_group(c) {
  hs[c] = 0;
  purge(); live_count();
  if
  :: n == 0 -> release_wake()
  :: else                         /* a permit's release pokes: see Abstracted away */
  fi;
  n = 0
}

proctype client(byte c) {
  d_step { ph[c] = WAITING; chg[c] = true };
end_run:
  do
  :: d_step { waiting(c) && chg[c] ->
       chg[c] = false;
       attempt(c)
     }
  :: d_step { ph[c] == HELD ->
       if
       :: md[c] == EX -> release_wake()                         /* release.lua */
       :: else -> release_group(c)
       fi;
       ph[c] = DONE; changed()
     }
  :: d_step { ph[c] == LEAVE ->                              /* leave.lua */
       wr = false; ph[c] = DONE; changed()
     }
  :: ph[c] == DONE -> break
  :: timeout -> assert(!waiting(c))                            /* live, when nothing moves */
  od;
  atomic { chg[c] = false }
}

/* Optional events (none is forced by fairness: env may stop). */
#define EVENTS(c) \
  :: d_step { ev > 0 && ph[c] == HELD ->                  /* the lease ends */ \
       ev--; ph[c] = DONE; \
       if :: md[c] == EX -> kind = FREE :: else -> hs[c] = 2 fi; \
       changed() } \
  :: d_step { ev > 0 && waiting(c) ->                     /* gives up */ \
       ev--; dequeue(c); \
       if :: md[c] == EX && wref -> ph[c] = LEAVE :: else -> ph[c] = DONE fi } \
  :: d_step { ev > 0 && waiting(c) && md[c] == EX ->      /* crashes */ \
       ev--; dequeue(c); ph[c] = DONE }

proctype env() {
  do
  EVENTS(0)
  EVENTS(1)
  EVENTS(2)
  :: d_step { ev > 0 && resv != NONE && waiting(resv) -> ev--; unreserve(); changed() }  /* a slow waiter's reservation ends */
  :: d_step { ev > 0 && xh -> ev--; xh = false; kind = FREE; changed() }   /* X's lease ends */
  :: break
  od
}

/* Time: what ends at some later point, whatever the clients do. */
proctype clock() {
end_clock:
  do
  :: d_step { resv != NONE && !waiting(resv) -> unreserve(); changed() }  /* a reservation for a departed waiter ends */
  :: d_step { xh -> xh = false; release_wake(); changed() }  /* X releases */
  :: d_step { kind == GRP && hs[0] != 1 && hs[1] != 1 && hs[2] != 1 ->
       kind = FREE; hs[0] = 0; hs[1] = 0; hs[2] = 0; changed() }  /* the group's keys expire */
#if MUTANT != 5
  :: d_step { wr && !waiting(0) -> wr = false; changed() }       /* a registration expires */
#endif
  od
}

init {
  atomic {
    if :: md[0] = EX :: md[0] = LM fi;
    if :: md[1] = SH :: md[1] = LM fi;
    if :: md[2] = SH :: md[2] = LM fi;
    if :: kind = EXCL; xh = true :: skip fi;
    run client(0); run client(1); run client(2);
    run env(); run clock()
  }
}

ltl live { [] ((waiting(0) -> <> !waiting(0)) && (waiting(1) -> <> !waiting(1)) &&
               (waiting(2) -> <> !waiting(2))) }
