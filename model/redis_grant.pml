/* redis_grant.pml: redislock's exclusive grant and wake-one queue on one
 * Redis server (standalone): acquire, release and the reservation of the
 * key for the waiter it wakes, lease expiry, waiters that leave, a lost
 * reply and its resend, renewals and the holder's local deadline.
 *
 * Mirrors:
 *   redisproto/lua/acquire.lua (acquire_fast.lua answers these states
 *       alike)  acquire(): own lease (a resent request: its token again),
 *       held (queue_waiter: ZADD NX), reserved for another waiter
 *       (reserved_left), grant (next_token from the marker, SET, ZREM)
 *   redisproto/lua/release.lua (release_fast.lua: its branch with nobody
 *       queued)  release(): owner compare, wake_one (ZPOPMIN until a
 *       PUBLISH reaches a subscriber), marker "|tok|waiter|until"
 *   redisproto/lua/refresh.lua  the renewal's compare-and-PEXPIRE (rnw)
 *   redisproto/waiters.go  Waiters.Begin/Leave/maybeDequeue (dequeue once
 *       no attempt is in flight), dequeuer.drainDequeues (ZREM in the
 *       background, retried when it fails): dq, bg
 *   redisproto/hub.go, redislock/watch.go  Watch (subscribed and
 *       confirmed before the queued attempts), Close (the UNSUBSCRIBE goes
 *       later: unsub), Ready (a kept channel: queued at once)
 *   redislock/acquire.go  tryScripts, Abort;  redislock/lease.go  Release
 *   wait.go  poll (first attempt without a wait id, Watch, attempts with
 *       it), attempt (unknown outcome: Abort in the background and the
 *       Acquire returns; abandoned at the context's end: late() undoes a
 *       grant), sleep (woken by name, or the backoff bounded by the TTL the
 *       last refusal saw), grant (no validity left: undone, transient)
 *   watchdog.go, lock.go  renew/apply/renewed, the local deadline
 *       (Lost(), then the cleanup release), Lock.Release
 * Each script is one atomic step. Each client makes one blocking Acquire,
 * then holds and releases. Client 0 renews (any number of times), may
 * pass its local deadline and may lose a reply; client 2 may give up
 * waiting. The waits of clients 0 and 1 took over kept channels (Ready:
 * queued by their first attempt); client 2 attempts without a wait id
 * first, then Watches. Attempts have fresh owners (att[c]; a number is
 * reused when nothing names the last one).
 *
 * Timing, as the order the design relies on:
 *  - Modelling choice: the holder's local deadline passes before the
 *    server's lease ends (the deadline is the start of the last acquire
 *    or renewal request plus TTL minus the drift allowance; the server's
 *    expiry counts from the script's execution). So the server expires a
 *    lease only once its holder observed Lost(), or when nobody believes
 *    it holds it; the lease of an attempt whose reply was lost may expire
 *    before the resend runs: that attempt's deadline passed, and grant()
 *    refuses its late grant. A clock jump (the client's monotonic clock
 *    stalled, a server clock running fast) breaks this order, and with it
 *    mutual exclusion: fencing covers it.
 *  - Tokens: next_token(last) = max(last + 1, server time). The server's
 *    clock (clk) is not assumed to pass the latest token between grants
 *    (a coarse or stepped-back clock, a promoted replica behind): only a
 *    lease's expiry (a TTL) moves it past every token. The marker alone
 *    orders the grants of a hand-over.
 *  - A waiter retries when woken by name, or once the lease or reservation
 *    its last refusal saw is gone (its backoff is bounded by that TTL, and
 *    by 500 ms); polls that would find the key as last seen change nothing
 *    and are not modelled.
 *  - A release's PUBLISH still reaches a waiter that left while its
 *    UNSUBSCRIBE is pending; a reservation may end before the woken
 *    waiter comes (it is late).
 *  - A link failure ends: at most DQFAILS removals fail (retries last
 *    30 s). A request go-redis timed out was lost or ran with its reply
 *    lost, and never runs after the call returned; -DLATE_COPY=1 lifts
 *    that (a delayed request delivered late): the clean assertion then
 *    fails (a departed waiter queued again after its ZREM).
 *
 * Abstracted away: shared and limited modes and the waiting-writer
 * registration (P:wr, leave.lua), the Lua-free (Tair) protocol, Cluster
 * (PUBLISH counts only local subscribers, so the first popped waiter is
 * reserved for regardless), wake_one's bound of 16 pops (3 waiters here),
 * receipts (a retried release changes nothing on the key), the marker's
 * and the queue's own expiry (an hour; a minute after the last failed
 * attempt), a renewal batch of several locks (each lock's result applies
 * alone: one lock per client), a renewal's lost reply (the deadline
 * passes), breaks, replica acks, the hold cap, metadata.
 *
 * Properties:
 *   mutex (assert)     at most one client believes it holds (held, no
 *                      Lost());
 *   lostfirst (assert) at each grant, every client that holds has
 *                      observed Lost();
 *   token (assert)     every grant's token is above the last granted one
 *                      (markers, reservations, expiry, resends);
 *   idem (assert)      a resent acquire gets the token of its attempt's
 *                      first grant: no second grant reaches the client;
 *   wake (assert)      a release that finds a live waiter queued reserves
 *                      the key for a queued subscriber and tells it;
 *   clean (assert)     once every Acquire returned, every lock was
 *                      released and the background work ended, no waiter
 *                      that left is still queued (as redislock's
 *                      TestWaiters_DepartedWaiterDequeued_AfterStallAndCut
 *                      checks);
 *   ltl strand         no live waiter waits for ever while nobody holds
 *                      the key (weak fairness).
 */
#ifndef MUTANT
#define MUTANT 0
#endif
#ifndef LATE_COPY
#define LATE_COPY 0
#endif
//@ mutant 1 a departed waiter's ZREM is sent once (before 105da79): after a failure it stays queued
//@ mutant 2 a release skips wake_one: no reservation, no waiter told
//@ mutant 3 a grant ignores the marker's token (next_token(0)): a hand-over's token can go back
//@ mutant 4 acquire.lua without the own-lease branch: a resent acquire is granted again, a second token
//@ mutant 5 a renewal answered after the local deadline revives the lock (renewed without its deadline check)
//@ mutant 6 the dequeue does not wait for the attempts in flight: an abandoned attempt queues the waiter again

#define N 3
#ifndef LOSSES
#define LOSSES 1    /* go-redis timeouts (a lost request or reply) in all */
#endif
#ifndef DEPARTS
#define DEPARTS 1   /* waits ended by their context in all */
#endif
#ifndef DQFAILS
#define DQFAILS 1   /* failed ZREMs of departed waiters in all */
#endif

/* Roles: client 0 renews, may lose its lock at its deadline and may lose
 * a reply; client 2 may give up waiting; client 1 only contends. */
#define LOSER(c)    (lossB > 0 && ((c) == 0 || (LATE_COPY && (c) == 2)))
#define DEPARTER(c) (departB > 0 && (c) == 2)
#define RENEWS(c)   ((c) == 0)
/* the waits of clients 0 and 1 took over channels that granted waits
 * left subscribed (Ready): their first attempts are queued; client 2's
 * first attempt carries no wait id, then it Watches */
#define READY(c)    ((c) != 2)

/* the key P:{T} */
#define FREE  0
#define LEASE 1
#define MARK  2
byte kv = FREE;
byte kc;          /* LEASE: the owner's client + 1 */
byte ka;          /* LEASE: the owner's attempt */
byte kt;          /* the lease's or the marker's token */
byte kres;        /* MARK: reserved for wait id (client + 1); 0: nobody */
bool kr;          /* MARK: the reservation is live */
byte q[N];        /* P:{T}:waiters in score order (wait ids), 0: empty */
bool sub[N];      /* the server has client c's channel subscribed */
byte clk = 1;     /* the server clock, in token units */

/* clients */
#define AWAIT  1  /* an attempt's request sent, not executed yet */
#define WAIT   2  /* refused, waiting (queued) */
#define HOLD   3
#define DONE   4  /* released */
#define GONE   5  /* the Acquire ended without the lock */
#define GAWAIT 6  /* ended while its attempt was in flight (abandoned) */
byte st[N];
byte att[N];      /* the current attempt, i.e. its owner */
bool wid[N];      /* attempts carry the wait id c + 1 (Watch done) */
byte rl[N];       /* go-redis timed out: 1 the reply will be lost, 2 the request
                     was, 3 the reply was */
byte seenK[N];    /* what the last refusal saw: 0 nothing, 2 a lease, 3 a reservation */
byte seenT[N];    /* ... with this token */
bool notif[N];    /* a wake-up on the waiter's channel, not yet taken */
bool lost[N];     /* Lost() closed */
byte rnw[N];      /* renewal: 0 none in flight, 1 sent, 2 refresh.lua extended, 3 refused */
byte relA[N];     /* a server release of attempt relA[c] to run (0: none):
                     Lock.Release, cleanup, undo, Abort */
bool dq[N];       /* the waiter's ZREM is pending */
bool unsub[N];    /* its UNSUBSCRIBE is pending */
byte lossB = LOSSES, departB = DEPARTS, dqfB = DQFAILS;
#if LATE_COPY
byte scC = 255, scA; bool scW;   /* a request go-redis gave up on, still to run */
#endif

/* ghosts */
byte lastTok = 0;  /* the last granted token */
byte ftok[N];      /* the first token granted to the current attempt */
bool late[N];      /* the current attempt's lease expired before its reply */

#define believes(c) (st[c] == HOLD && !lost[c])
#define inq(w) (q[0] == (w) || q[1] == (w) || q[2] == (w))
/* a live waiter: waiting, or its attempt in flight */
#define live(c) (st[c] == WAIT || st[c] == AWAIT)
/* the key is as client c's last refusal saw it */
#define seen(c) ((seenK[c] == 2 && kv == LEASE && kt == seenT[c]) || \
                 (seenK[c] == 3 && kv == MARK && kr && kt == seenT[c]))

inline qadd(w) {
  if
  :: w == 0 || inq(w) -> skip
  :: else ->
     if
     :: q[0] == 0 -> q[0] = w
     :: else -> if :: q[1] == 0 -> q[1] = w :: else -> q[2] = w fi
     fi
  fi
}

inline qrem(w) {
  if
  :: w != 0 && q[0] == w -> q[0] = q[1]; q[1] = q[2]; q[2] = 0
  :: w != 0 && q[1] == w -> q[1] = q[2]; q[2] = 0
  :: w != 0 && q[2] == w -> q[2] = 0
  :: else -> skip
  fi
}

/* acquire.lua for owner (c, a) with wait id w; the reply in rk (1
 * granted, 2 held, 3 reserved) and rt (the token granted or seen). */
inline acquire(c, a, w, rk, rt) {
  if
#if MUTANT != 4
  :: kv == LEASE && kc == c + 1 && ka == a ->
     qrem(w); rk = 1; rt = kt        /* a resent request: its own lease */
#endif
  :: kv == LEASE && !(kc == c + 1 && ka == a) ->
     qadd(w); rk = 2; rt = kt        /* held */
  :: kv == MARK && kr && kres != w ->
     qadd(w); rk = 3; rt = kt        /* reserved for another waiter */
  :: else ->
     /* free, or a marker reserving nothing for another (MUTANT 4: or
      * this owner's lease): next_token(last) = max(last + 1, server time) */
#if MUTANT == 3
     rt = 1;
#else
     rt = (kv == MARK -> kt + 1 : 1);
#endif
     rt = (rt > clk -> rt : clk);
     assert(rt > lastTok);                                   /* token */
     assert(!believes(0) && !believes(1) && !believes(2));   /* lostfirst */
     lastTok = rt;
     kv = LEASE; kc = c + 1; ka = a; kt = rt; kr = false; kres = 0;
     qrem(w); rk = 1;
     if
     :: (st[c] == AWAIT || st[c] == GAWAIT) && att[c] == a && ftok[c] == 0 -> ftok[c] = rt
     :: else -> skip
     fi
  fi
}

/* release.lua for owner (c, a). */
inline release(c, a, w, lw) {
  if
  :: kv == LEASE && kc == c + 1 && ka == a ->
     lw = (inq(1) && live(0)) || (inq(2) && live(1)) || (inq(3) && live(2));
     w = 0;
#if MUTANT != 2
     do                      /* wake_one */
     :: q[0] == 0 -> break
     :: q[0] != 0 ->
        w = q[0]; q[0] = q[1]; q[1] = q[2]; q[2] = 0;
        if
        :: sub[w - 1] -> notif[w - 1] = true; break   /* PUBLISH reached it */
        :: else -> w = 0
        fi
     od;
#endif
     kv = MARK; kc = 0; ka = 0; kres = w; kr = (w != 0);
     assert(!lw || kr);                                      /* wake */
     w = 0; lw = false
  :: else -> skip           /* not this owner's: released already, or gone */
  fi
}

/* A release of attempt a, run later in the background (a second one of
 * the same lease joins the request in flight: Lock.releaseServer). */
inline setrel(c, a) {
  assert(relA[c] == 0 || relA[c] == a || !(kv == LEASE && kc == c + 1 && ka == relA[c]));
  relA[c] = a
}

#if LATE_COPY
#define NAMED(c) ((kv == LEASE && kc == c + 1 && ka == att[c]) || relA[c] == att[c] || (scC == c && scA == att[c]))
#else
#define NAMED(c) ((kv == LEASE && kc == c + 1 && ka == att[c]) || relA[c] == att[c])
#endif
/* A new attempt gets a fresh owner; the number is reused when nothing
 * on the server or pending names the last one (indistinguishable). */
inline newattempt(c) {
  if
  :: NAMED(c) -> att[c]++
  :: else -> skip
  fi;
  ftok[c] = 0; late[c] = false; seenK[c] = 0; seenT[c] = 0; st[c] = AWAIT
}

/* The Acquire returns without the lock: its subscription is closed (the
 * UNSUBSCRIBE goes later) and Waiter.Leave dequeues it once no attempt
 * is in flight (inflight: an attempt's call has not returned yet). */
inline depart(c, inflight) {
  notif[c] = false; seenK[c] = 0; seenT[c] = 0;
  if
  :: wid[c] -> unsub[c] = true;
#if MUTANT == 6
     dq[c] = true
#else
     dq[c] = !inflight
#endif
  :: else -> skip
  fi
}

/* The attempt's reply is handled (wait.go attempt and grant, redislock
 * tryScripts). */
inline reply(c, w, k, t) {
  if
  :: k == 1 && late[c] ->
     /* grant(): no validity left; undone, a transient failure */
     setrel(c, att[c]); st[c] = WAIT
  :: k == 1 && !late[c] ->
     assert(t == ftok[c]);                                   /* idem */
     assert(!believes(0) && !believes(1) && !believes(2));   /* mutex */
     st[c] = HOLD; lost[c] = false; notif[c] = false; ftok[c] = 0;
     sub[c] = false    /* no queue holds the id: its channel is idle */
  :: k >= 2 && !wid[c] ->
     /* Watch (confirmed), then attempt again at once, queued */
     sub[c] = true; wid[c] = true; newattempt(c)
  :: k >= 2 && wid[c] -> seenK[c] = k; seenT[c] = t; st[c] = WAIT
  fi
}

proctype client(byte c) {
  byte w, k, t;
  st[c] = AWAIT; att[c] = 1;
  wid[c] = READY(c); sub[c] = READY(c);
  do
  /* the attempt's request runs: its reply is handled, or lost (rl), or
   * goes to the abandoned attempt's late() */
  :: d_step {
       (st[c] == AWAIT || st[c] == GAWAIT) && rl[c] <= 1 ->
       w = (wid[c] -> c + 1 : 0);
       acquire(c, att[c], w, k, t);
       if
       :: rl[c] == 1 -> rl[c] = 3                 /* the reply is lost */
       :: rl[c] != 1 && st[c] == GAWAIT ->
          if :: k == 1 -> relA[c] = att[c] :: else -> skip fi;   /* late(): undo */
#if MUTANT != 6
          dq[c] = wid[c];                          /* the call returned: Leave's dequeue */
#endif
          st[c] = GONE
       :: rl[c] != 1 && st[c] == AWAIT -> reply(c, w, k, t)
       fi;
       w = 0; k = 0; t = 0
     }
  /* go-redis times out: the reply will be lost (1), or the request is (2) */
  :: atomic { st[c] == AWAIT && rl[c] == 0 && LOSER(c) -> lossB--; if :: rl[c] = 1 :: rl[c] = 2 fi }
#if LATE_COPY
  /* ... or the request is late: it runs after the call gave up on it */
  :: atomic { st[c] == AWAIT && rl[c] == 0 && LOSER(c) -> lossB--; rl[c] = 2; scC = c; scA = att[c]; scW = wid[c] }
  :: atomic {
       st[c] == GAWAIT && LOSER(c) ->
       lossB--; scC = c; scA = att[c]; scW = wid[c];
       setrel(c, att[c]); dq[c] = wid[c]; st[c] = GONE   /* Abort; the call returned: dequeue */
     }
#endif
  /* ... then it resends (same owner), or the call fails: an unknown
   * outcome, Abort in the background, and the Acquire returns */
  :: atomic {
       st[c] == AWAIT && rl[c] >= 2 ->
       rl[c] = 0;
       if
       :: skip
       :: setrel(c, att[c]); st[c] = GONE; depart(c, false)
       fi
     }
  /* the wait's context ends with the request in flight: abandoned */
  :: atomic { st[c] == AWAIT && rl[c] == 0 && DEPARTER(c) -> departB--; st[c] = GAWAIT; depart(c, true) }

  /* waiting: woken by name, or the backoff (bounded by what was seen) */
  :: atomic { st[c] == WAIT && notif[c] -> notif[c] = false; newattempt(c) }
  :: atomic { st[c] == WAIT && !seen(c) -> newattempt(c) }
  :: atomic { st[c] == WAIT && DEPARTER(c) -> departB--; st[c] = GONE; depart(c, false) }

  /* holding: the watchdog's renewal (refresh.lua, then its answer), the
   * local deadline (Lost(), then the cleanup release), Release */
  :: atomic { st[c] == HOLD && RENEWS(c) && !lost[c] && rnw[c] == 0 -> rnw[c] = 1 }
  :: d_step { st[c] == HOLD && rnw[c] == 1 -> rnw[c] = (kv == LEASE && kc == c + 1 && ka == att[c] -> 2 : 3) }
#if MUTANT == 5
  :: atomic { st[c] == HOLD && rnw[c] == 2 -> rnw[c] = 0; lost[c] = false }
#else
  :: atomic { st[c] == HOLD && rnw[c] == 2 -> rnw[c] = 0 }   /* renewed(): later deadline, unless it passed */
#endif
  :: atomic { st[c] == HOLD && rnw[c] == 3 -> rnw[c] = 0; lost[c] = true }   /* ErrNotHeld */
  :: atomic { st[c] == HOLD && RENEWS(c) && !lost[c] -> lost[c] = true; setrel(c, att[c]) }
  :: atomic {
       st[c] == HOLD && RENEWS(c) ->
       if :: !lost[c] -> setrel(c, att[c]) :: else -> skip fi;   /* Release: in the background */
       lost[c] = false; rnw[c] = 0; st[c] = DONE
     }
  :: d_step { st[c] == HOLD && !RENEWS(c) -> release(c, att[c], w, k); st[c] = DONE }

  :: st[c] == DONE || st[c] == GONE -> break
  od
}

/* The server's clock and the clients' background work. */
#if MUTANT == 1
#define DQFAIL(c) dq[c] = false    /* sent once into the stall */
#else
#define DQFAIL(c) skip             /* retried with backoff */
#endif
#define BG(c) \
  :: d_step { dq[c] -> w = c + 1; qrem(w); w = 0; dq[c] = false } \
  :: atomic { dq[c] && dqfB > 0 -> dqfB--; DQFAIL(c) } \
  :: atomic { unsub[c] -> sub[c] = false; unsub[c] = false }

#define expire kv = FREE; kc = 0; ka = 0; kt = 0; clk = lastTok + 1

proctype bg() {
  byte w, k, t;
  bool lw;
end:
  do
  /* a release in the background (client 0's first when both are due) */
  :: d_step {
       relA[0] != 0 || relA[2] != 0 ->
       k = (relA[0] != 0 -> 0 : 2);
       release(k, relA[k], w, lw); relA[k] = 0; k = 0
     }
  BG(0)
  BG(2)
#if LATE_COPY
  /* the late request runs; its reply goes nowhere */
  :: d_step {
       scC != 255 ->
       w = (scW -> scC + 1 : 0); acquire(scC, scA, w, k, t);
       w = 0; k = 0; t = 0; scC = 255; scA = 0; scW = false
     }
#endif
  /* the reservation ends */
  :: atomic { kv == MARK && kr -> kr = false }
  /* the lease expires: once its holder observed Lost(), or while nobody
   * holds it (the reply of its attempt lost: that attempt's deadline
   * passed, its late reply is refused) */
  :: d_step { kv == LEASE && !(att[kc - 1] == ka && (st[kc - 1] == HOLD || st[kc - 1] == AWAIT)) -> expire }
  :: d_step { kv == LEASE && st[kc - 1] == HOLD && att[kc - 1] == ka && lost[kc - 1] -> expire }
  :: d_step { kv == LEASE && st[kc - 1] == AWAIT && att[kc - 1] == ka -> late[kc - 1] = true; expire }
  od
}

#define freeKey (kv != LEASE)
#define waiting (st[0] == WAIT || st[1] == WAIT || st[2] == WAIT)
#define stale ((st[0] == GONE && inq(1)) || (st[2] == GONE && inq(3)))


init {
  atomic {
    run client(0); run client(1); run client(2); run bg()
  };
  /* clean: once every Acquire returned, every lock was released and the
   * background work is done, no departed waiter is left queued (as
   * TestWaiters_DepartedWaiterDequeued_AfterStallAndCut checks) */
  atomic {
    (st[0] == DONE || st[0] == GONE) && (st[1] == DONE || st[1] == GONE) &&
    (st[2] == DONE || st[2] == GONE) && relA[0] == 0 && relA[2] == 0 &&
    !dq[0] && !dq[2] && !unsub[0] && !unsub[2] ->
    assert(!stale)
  }
}


ltl strand { ! <> [] (freeKey && waiting) }
