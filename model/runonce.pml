/* runonce.pml: a scheduled job run at most once per period (dlock.RunOnce,
 * runonce.go).
 *
 * Mirrors:
 *   runonce.go  RunOnce         every replica's scheduler calls it in each
 *                               period's window: TryAcquire (tryTransient),
 *                               runOnceBounds, fn, then the deferred
 *                               release: now, or by a timer
 *                               (background.AfterFunc) at start+atLeastFor
 *               runOnceBounds   the granted lease is checked before fn runs;
 *                               refused: released, ran = false, an error
 *               keepUntil       start + atLeastFor: the deferred release
 *                               waits for it also when the lock was lost
 *   lock.go     newLock, renewTTL, capDeadline, lose, cleanup
 *                               the watchdog renews the lease, clipped to
 *                               the hold cap (WithMaxHold(atMostFor)); the
 *                               lock is lost at its local deadline (start +
 *                               TTL - drift) or hold cap (start + maxHold -
 *                               drift), which may come before atLeastFor
 *                               (RunOnce accepts TTL == maxHold ==
 *                               atLeastFor): fn's context is cancelled,
 *                               and cleanup releases the server lease no
 *                               sooner than releaseNotBefore (RunOnce's
 *                               keepUntil: background.AfterFunc)
 *   driver/driver.go  Grant     what the backend grants (TTL,
 *                               EndsWithClient, Linger), abstracted as
 *                               three kinds of lease:
 *     FIRM    TTL in [atLeastFor, atMostFor], outlives its client, gone by
 *             atMostFor (every backend with server-side expiry);
 *     WEAK    may end before atLeastFor once its client stops renewing: it
 *             ends with its client's session (zklock: an ephemeral node, a
 *             clean exit deletes it) or its TTL is below atLeastFor (a
 *             ZooKeeper session's two thirds);
 *     LINGER  a dead holder's lease outlives atMostFor (zklock.LingerOf the
 *             session timeout, etcdlock's whole seconds).
 * One backend for all replicas, its kind chosen at the start. Each
 * TryAcquire is one atomic step on the key (exclusive: no live lease).
 *
 * Timing, as the order the design relies on. Time is a clock process
 * that steps through four events per period p: OPEN (the window: every
 * replica's attempt for p, retries included, is sent in it), SHUT (the
 * window is over), LEAST (atLeastFor has passed since the run's attempt
 * was sent), MOST (atMostFor has). Assumptions:
 *   T1 skew + the retry span < atLeastFor: a replica fires, and sends its
 *      attempts (up to RunOnceAttempts, a backoff step of at least 50 ms
 *      apart), before atLeastFor has passed since another replica's
 *      RunOnce of the same period began (keepUntil counts from RunOnce's
 *      start) (SHUT before LEAST);
 *   T2 the lease held for atLeastFor is not released early: nothing frees
 *      the key before LEAST but a WEAK lease (which runOnceBounds refuses)
 *      and what RunOnce releases itself, and it releases nothing before
 *      start + atLeastFor: neither the release timer nor a lost lock's
 *      cleanup (releaseNotBefore; mutant 4 is the release at once before
 *      851643d), both measured on a monotonic clock (Go's time.Now
 *      reading; mutant 3 is a clock that jumps). T2 no longer requires
 *      TTL - drift >= atLeastFor or maxHold - drift >= atLeastFor: the
 *      lock's local deadline and hold cap may come before LEAST (the drift
 *      allowance), and the lock is lost then, at any point of the run in
 *      the model. Assumed instead: the server lease outlives atLeastFor,
 *      as TTL >= atLeastFor and maxHold >= atLeastFor (the code checks
 *      both) and renewals are clipped to the cap, counted from the grant
 *      (after start) on the server's own monotonic clock, which does not
 *      run fast against the replica's (no drift allowance covers that);
 *   T3 periods are at least skew + atMostFor apart: the next window opens
 *      after MOST (shorter periods only make replicas skip a period while
 *      a run overruns, which at-most-once does not care about).
 * A FIRM or LINGER lease may expire once LEAST has passed, not before
 * (its TTL and cap are at least atLeastFor; renewals may fail, or stop
 * when the lock is lost); at MOST every lease of the period ends
 * (renewals are clipped to the cap, maxHold <= atMostFor) except a LINGER
 * lease of a dead or paused holder.
 *
 * Abstracted away: durations (only the order above), transient failures
 * and retries (tryTransient; a split vote that makes every replica skip,
 * ee9c222, is a matter of chance, not of order), the backend's protocol
 * (a grant and a release are atomic on the key; a refused grant is
 * released at once), fn's error and context, ctx, panics, the Observer;
 * each acquisition has its own owner (NewOwner), so a release (timer,
 * cleanup, a late defer) only ever removes its own lease; a replica's
 * periods run one after another (a replica still busy with period p when
 * p+1's window ends just misses p+1); a clean exit and a crash are one
 * step (the process stops: no renewal, no timer; a WEAK lease may end
 * at once, as ZooKeeper deletes the node of a closed session); a pause
 * is a stop that resumes.
 *
 * Properties (assertions):
 *   once:      the job starts at most once per period (ghost runs[p]);
 *   atMostFor: a replica that fires in period p and finds the key held
 *              finds a lease of p (no dead or paused runner keeps the key
 *              into the next period): with T3, a period in which a
 *              replica fired ends with its run or an error, never
 *              silently skipped by every replica.
 */
#ifndef MUTANT
#define MUTANT 0
#endif
//@ mutant 1 before 29bc352 (7b962cf, no runOnceBounds): a WEAK lease runs the job and ends when its runner exits, crashes or pauses, before atLeastFor: a late replica runs the job again in the same period
//@ mutant 2 the run's end releases the key at once instead of keeping it until atLeastFor: a late replica runs the job again
//@ mutant 3 the release timer and the deadline on a clock that jumps forward (a wall-clock reading): the key is released before atLeastFor
//@ mutant 4 before 851643d: a lock lost at its cap or local deadline (drift allowance before atLeastFor) is released at once: a late replica runs the job again
//@ mutant 5 before ea08d69 (c6e9faf): WithShared passed through to TryAcquire, every replica gets the key and runs the job
//@ mutant 6 runOnceBounds without its linger case: a dead runner's LINGER lease keeps the key into the next period, which every replica skips

#define N 3        /* replicas */
#define P 2        /* periods */
#define END (4*P)  /* the clock after the last period */

#define FIRM   0
#define WEAK   1
#define LINGER 2

/* The clock: period clk/4, event clk%4 (OPEN, SHUT, LEAST, MOST). */
byte clk = 0;
#define OPEN(p)  (clk == 4*(p))
#define LEAST(p) (clk >= 4*(p)+2)

/* The backend. */
byte kind;            /* the kind of lease it grants */
bool lease[N];        /* replica i's lease on the key is live */
byte gp[N];           /* the period of replica i's grant */
#define HELD (lease[0] || lease[1] || lease[2])
#define OFPERIOD(p) ((!lease[0] || gp[0] == (p)) && (!lease[1] || gp[1] == (p)) && (!lease[2] || gp[2] == (p)))

/* The replicas. */
bool up[N];           /* the process runs (no crash, no exit) */
bool paused[N];       /* the process is paused */
#define STOPPED(i) (!up[i] || paused[i])
#if MUTANT == 3
bool jumped[N];       /* i's clock jumped forward */
#define LLEAST(i, p) (LEAST(p) || jumped[i])
#else
#define LLEAST(i, p) LEAST(p)
#endif
bool lost[N];         /* i's lock is lost (its cap or deadline passed) */

/* Ghost. */
byte runs[P];         /* runs of the job per period */

#define IDLE 0        /* between RunOnce calls */
#define RUN  1        /* fn runs */
#define WAIT 2        /* RunOnce returned, the release timer is set */

/* Replica i is done with its period p: its lease released (or gone). */
#define DONE lease[i] = false; lost[i] = false; st = IDLE; p++

proctype replica(byte i) {
  byte p = 0, st = IDLE;
  do
  :: st == IDLE && p == P -> break
  :: st == IDLE && p < P && clk > 4*p -> p++   /* not fired in p's window */
  :: atomic { st == IDLE && p < P && OPEN(p) ->
     /* RunOnce: TryAcquire. */
     if
#if MUTANT == 5
     :: true ->
#else
     :: !HELD ->
#endif
        lease[i] = true; gp[i] = p;
        /* runOnceBounds */
        if
#if MUTANT == 1
        :: false ->
#elif MUTANT == 6
        :: kind == WEAK ->
#else
        :: kind != FIRM ->
#endif
           lease[i] = false; p++        /* refused: released, an error */
        :: else ->
           runs[p]++;                   /* fn starts */
           assert(runs[p] <= 1);        /* once */
           st = RUN
        fi
#if MUTANT != 5
     :: else ->
        assert(OFPERIOD(p));            /* atMostFor */
        p++                             /* held: (false, nil) */
#endif
     fi }
  :: atomic { st == RUN ->
     /* fn returns: the deferred release. */
#if MUTANT == 2
     DONE
#else
     if
     :: LLEAST(i, p) -> DONE          /* wait <= 0: Release now */
#if MUTANT == 4
     :: lost[i] -> DONE               /* before 851643d: lost, Release now */
#endif
     :: else -> st = WAIT             /* AfterFunc(wait, Release) */
     fi
#endif
     }
  :: atomic { st == WAIT && LLEAST(i, p) -> DONE }     /* the timer's Release */
  /* The cap or local deadline passes, before LEAST or after: the lock is
   * lost, fn's context cancelled; the lease stays on the server. */
  :: atomic { st != IDLE && lease[i] && !lost[i] ->
     lost[i] = true;
#if MUTANT == 4
     lease[i] = false         /* before 851643d: cleanup releases at once */
#else
     skip
#endif
     }
  :: atomic { st != IDLE && lost[i] && lease[i] && LLEAST(i, p) ->
     lease[i] = false }       /* cleanup: AfterFunc(releaseNotBefore) */
  :: st == RUN -> paused[i] = true; paused[i] = false   /* a pause in fn */
  :: st != IDLE -> up[i] = false; break                 /* crash, or exit */
#if MUTANT == 3
  :: !jumped[i] -> jumped[i] = true                     /* the clock jumps */
#endif
  od;
  p = 0; st = IDLE
}

/* The lease of replica j ends at MOST of its period, unless it lingers. */
inline atMost(j, q) {
  if
  :: lease[j] && gp[j] == q && !(kind == LINGER && STOPPED(j)) -> lease[j] = false
  :: else
  fi
}

/* The lease of replica j may expire: a WEAK one once its holder stopped
 * renewing (its session closed, or its short TTL ran out), a FIRM or
 * LINGER one once atLeastFor passed (TTL >= atLeastFor). */
#define EXPIRES(j) (lease[j] && (kind == WEAK && STOPPED(j) || kind != WEAK && LEAST(gp[j])))

proctype clock() {
  do
  :: atomic { clk < END ->
     clk++;
     if
     :: clk % 4 == 3 -> atMost(0, clk/4); atMost(1, clk/4); atMost(2, clk/4)
     :: else
     fi }
  :: atomic { EXPIRES(0) -> lease[0] = false }
  :: atomic { EXPIRES(1) -> lease[1] = false }
  :: atomic { EXPIRES(2) -> lease[2] = false }
  :: clk == END -> break
  od
}

init {
  atomic {
    if
    :: kind = FIRM
    :: kind = WEAK
    :: kind = LINGER
    fi;
    up[0] = true; up[1] = true; up[2] = true;
    run clock(); run replica(0); run replica(1); run replica(2)
  }
}
