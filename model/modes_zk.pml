/* modes_zk.pml: zklock's shared and limited locks (the read-write and
 * semaphore queue recipe, zklock/modes.go, acquire.go, watch.go).
 *
 * Mirrors:
 *   acquire.go  create            a node joins the key's queue (ephemeral
 *                                 sequential: appended at the end)
 *               Queue             look (the listing) -> admitted: grant,
 *                                 markIfFollowed; else waitOn, wait for
 *                                 its watch, and look again when it fires
 *                                 or, waiting on a mark, at markRelook
 *   modes.go    compatible, blocker, admitted, holdersOf
 *   watch.go    waitOn            the first permit not admitted watches the
 *                                 key's children; a permit behind waiting
 *                                 permits of its size watches the one just
 *                                 ahead for its granted mark (onMark); any
 *                                 other waiter watches its blocker; a node
 *                                 ahead already gone, or a Limited one
 *                                 already marked (seenMark), sends it to
 *                                 look again at once
 *               markIfFollowed    a permit granted with nodes behind it
 *                                 writes the mark into its node, later (in
 *                                 the background), if its client still runs
 *   lease.go    Release           a holder deletes its node
 *   orphans.go  abandonWithin     a waiter that gives up deletes its node
 * Sessions: a session that ends deletes its client's node (ephemeral).
 *
 * Timing, as the order the design relies on: ZooKeeper is one linearizable
 * store (a waiter's look syncs first, acquire.go look: what it reads is
 * never older than the leader's queue when it was sent); a holder's lease
 * ends before its session does (LeaseOf: two thirds of the session
 * timeout), so a session that ends takes the lease and then the node, in
 * one step; markRelook (a third of the lease) passes while a waiter waits
 * on a mark, at some later point. Nothing else about time enters.
 *
 * Environment (process env, at most EVENTS_MAX events; it may stop at any
 * point, so nothing it does is forced by fairness): a waiter's node goes
 * (its context ended: abandonWithin; or its session ended); a waiter or a
 * holder freezes (a stalled link or a paused process whose session
 * outlives the run): it takes no further step and its node stays. A
 * holder's session that ends is its release, to everyone else.
 *
 * Abstracted away: tokens (czxid; guard.pml covers fences), followers and
 * syncs (see Timing), a lost create reply and its find by owner id, the
 * own-node probe (a session's end is noticed in the same step), watches
 * missed across a reconnect (the pzxid probe of a children wait, at most
 * 250ms later, stands in for the event), a kept unfired mark watch (it
 * is equivalent to a new watch: the node did not change since it was set,
 * so a fresh data read would find the same), limits other than LIMIT (a
 * mismatch is an error before waiting), TryAcquire (an Acquire that gives
 * up after its first look), foreign nodes, Break. Each client makes one
 * acquisition, and clients are numbered in the order their nodes are
 * created (sequence order), with modes: 0 a reader or a permit, 1 a writer
 * or a permit, 2 a reader or a permit, 3 a permit. Four clients: the
 * granted mark matters only for a permit behind a waiting permit of its
 * size, which needs LIMIT + 2 nodes (as in zklock's
 * TestSemaphore_FrozenWaiterDoesNotBlockQueue: p1, p2, a frozen waiter, w4).
 *
 * Properties:
 *   limit:   at most LIMIT permit holders, and modes never mix: an
 *            exclusive holder alone, shared holders only with shared ones
 *            (assertion at each grant; holds only end afterwards);
 *   writer:  writer preference: a shared node is never granted while an
 *            exclusive node created before it is queued (assertion);
 *   live:    no waiter stranded while it could be granted: a client still
 *            waiting whose node the recipe admits eventually stops waiting
 *            (learns it holds, or its node goes) -- ltl, weak fairness;
 *            also asserted when nothing can move.
 */
#ifndef MUTANT
#define MUTANT 0
#endif
//@ mutant 1 no relook on a mark wait (before a6c8da6): a permit behind a frozen waiting permit waits for a granted mark that never comes, with a permit free
//@ mutant 2 a waiter takes its watch firing as its admission without looking again: the node ahead gave up, not released, and a writer joins the holder
//@ mutant 3 a shared node checks only the holders' modes, not the queued nodes ahead: a reader overtakes a waiting writer
//@ mutant 4 a permit is admitted with LIMIT permits ahead (i <= limit): one permit too many

#define NC 4        /* clients (nodes) */
#define LIMIT 2     /* permits of the semaphore */
#define NONE 9
#define EVENTS_MAX 2 /* environment events in all */
#define CH 8        /* dep: the key's children */

/* modes (driver.Mode) */
#define EX 1
#define SH 2
#define LM 3

/* a client's phase */
#define IDLE 0
#define LOOK 1      /* look (list the queue) is due */
#define SETW 2      /* waitOn is due: set the watch on dep */
#define WAIT 3      /* waiting for the watch (or the relook) */
#define HELD 4
#define DONE 5
#define FROZEN 6

/* ZooKeeper: the key's queue, lowest sequence first. */
byte q[NC];
byte qn = 0;
bool node[NC];     /* client c's node is in the queue */
bool mark[NC];     /* its data carries the granted mark */

/* The clients. */
byte md[NC];       /* the request's mode */
byte ph[NC];       /* phase */
byte dep[NC];      /* what a waiter watches: a client's node, or CH */
bool onMark[NC];   /* waitOn's onMark: a wait on a mark */
bool fired[NC];    /* its watch fired (one-shot, buffered) */
byte seen[NC];     /* seenMark: the node ahead whose mark made it look */
bool mpend[NC];    /* markIfFollowed's write is yet to be made */

/* Ghost: the recipe admits client c's node (recomputed at each change of
 * the queue). */
bool adm[NC];

/* The environment's events left. */
byte ev = EVENTS_MAX;

/* Scratch for the d_steps (reset after each use). */
byte p, j, k, n, x;

#define waiting(c) (ph[c] == LOOK || ph[c] == SETW || ph[c] == WAIT)
#define compat(a, b) (((a) == SH && (b) == SH) || ((a) == LM && (b) == LM))

/* p = position of c's node in q (NONE if absent) */
inline pos(c) {
  p = 0;
  do
  :: p < qn && q[p] != c -> p++
  :: else -> break
  od;
  if
  :: p == qn -> p = NONE
  :: else
  fi
}

/* j = blocker(q, p) (modes.go): the last node ahead that q[p] cannot hold
 * the key with; NONE if none. */
inline blocker() {
  j = NONE; k = p;
  do
  :: k > 0 ->
     k--;
#if MUTANT == 3
     /* a reader looks only at the holders' mode (q[0]'s) */
     if
     :: md[q[p]] == SH && k == 0 && !compat(SH, md[q[0]]) -> j = 0; break
     :: md[q[p]] == SH && !(k == 0 && !compat(SH, md[q[0]])) -> skip
     :: md[q[p]] != SH && (md[q[p]] == EX || !compat(md[q[p]], md[q[k]])) -> j = k; break
     :: else
     fi
#else
     if
     :: md[q[p]] == EX || !compat(md[q[p]], md[q[k]]) -> j = k; break
     :: else
     fi
#endif
  :: else -> break
  od;
  k = 0
}

/* x = admitted(q, p) (modes.go); uses p, sets j. */
inline admitted() {
  blocker();
#if MUTANT == 4
  x = (j == NONE && (md[q[p]] != LM || p <= LIMIT))
#else
  x = (j == NONE && (md[q[p]] != LM || p < LIMIT))
#endif
}

inline recompute() {
  n = 0;
  do
  :: n < NC ->
     pos(n);
     if
     :: p == NONE -> adm[n] = false
     :: else -> admitted(); adm[n] = x
     fi;
     n++
  :: else -> break
  od;
  n = 0; p = 0; j = 0; x = 0
}

/* A node's deletion or data change fires the data watches on it. */
inline fire_node(c) {
  n = 0;
  do
  :: n < NC -> if :: ph[n] == WAIT && dep[n] == c -> fired[n] = true :: else fi; n++
  :: else -> break
  od;
  n = 0
}

/* A child created or deleted fires the key's children watches. */
inline fire_children() {
  n = 0;
  do
  :: n < NC -> if :: ph[n] == WAIT && dep[n] == CH -> fired[n] = true :: else fi; n++
  :: else -> break
  od;
  n = 0
}

/* c's node goes (release, give-up, session end). */
inline remove(c) {
  pos(c);
  do
  :: p + 1 < qn -> q[p] = q[p + 1]; p++
  :: else -> break
  od;
  qn--; q[qn] = 0; node[c] = false; mark[c] = false;
  fire_node(c); fire_children(); recompute()
}

/* The invariants a grant must keep: checked as c is granted. */
inline check_grant(c) {
  n = 0; k = 0; x = 0;
  do
  :: n < NC ->
     if
     :: ph[n] == HELD ->
        k++;
        if :: md[n] == LM -> x++ :: else fi;
        /* limit: modes never mix */
        assert(n == c || (md[n] != EX && md[c] != EX && md[n] == md[c]))
     :: else
     fi;
     n++
  :: else -> break
  od;
  assert(x <= LIMIT);   /* limit: at most LIMIT permits */
  /* writer: no exclusive node queued ahead of a granted reader */
  if
  :: md[c] == SH ->
     pos(c); n = 0;
     do
     :: n < p -> assert(md[q[n]] != EX); n++
     :: else -> break
     od
  :: else
  fi;
  n = 0; k = 0; x = 0; p = 0
}

/* Queue's look: the listing; admitted -> granted (and markIfFollowed),
 * else compute what waitOn will watch. */
inline look(c) {
  pos(c);
  if
  :: p == NONE -> ph[c] = DONE   /* the node vanished (session) */
  :: else ->
     admitted();
     if
     :: x ->
        ph[c] = HELD;
        /* markIfFollowed: a limited node with nodes behind it */
        mpend[c] = (md[c] == LM && p < qn - 1);
        check_grant(c)
     :: else ->
        onMark[c] = false;
        if
        :: j == NONE && p == LIMIT -> dep[c] = CH
        :: j == NONE && p != LIMIT -> dep[c] = q[p - 1]; onMark[c] = true
        :: j != NONE -> dep[c] = q[j]
        fi;
        ph[c] = SETW
     fi
  fi;
  p = 0; j = 0; x = 0
}

/* waitOn: set the watch (ChildrenW or GetW, each one read). */
inline setw(c) {
  if
  :: dep[c] == CH ->
     pos(c);
     if
     :: p == NONE -> ph[c] = LOOK
     :: else ->
        admitted();
        if
        :: x -> ph[c] = LOOK
        :: else -> fired[c] = false; ph[c] = WAIT
        fi
     fi;
     p = 0; j = 0; x = 0
  :: dep[c] != CH && !node[dep[c]] -> ph[c] = LOOK
  :: dep[c] != CH && node[dep[c]] && md[dep[c]] == LM && mark[dep[c]] && seen[c] != dep[c] ->
     seen[c] = dep[c]; ph[c] = LOOK
  :: else -> fired[c] = false; ph[c] = WAIT
  fi
}

proctype client(byte c) {
  atomic {
    (c == 0 || ph[c - 1] != IDLE) ->   /* clients are numbered in creation order */
    q[qn] = c; qn++; node[c] = true;
    fire_children(); recompute();
    ph[c] = LOOK
  }
end_run:
  do
  :: d_step { ph[c] == LOOK -> look(c) }
  :: d_step { ph[c] == SETW -> setw(c) }
  :: d_step { ph[c] == WAIT && fired[c] ->
       fired[c] = false;
#if MUTANT == 2
       /* the watch's firing taken as the turn */
       ph[c] = HELD; mpend[c] = false; check_grant(c)
#else
       ph[c] = LOOK
#endif
     }
#if MUTANT != 1
  :: d_step { ph[c] == WAIT && onMark[c] -> ph[c] = LOOK }   /* markRelook */
#endif
  :: d_step { ph[c] == HELD && mpend[c] ->
       mpend[c] = false;
       if
       :: node[c] -> mark[c] = true; fire_node(c)
       :: else
       fi
     }
  :: d_step { ph[c] == HELD -> mpend[c] = false; remove(c); ph[c] = DONE }   /* Release */
  :: ph[c] == DONE -> break
  :: timeout ->
     /* live, as a deadlock check: nothing can move, and a waiter the
      * recipe admits still waits */
     assert(!(ph[c] == WAIT && adm[c]))
  od;
  atomic { dep[c] = 0; onMark[c] = false; fired[c] = false; seen[c] = NONE }
}

/* The environment: a waiter's context ends (or its session: its node goes
 * either way), a waiter or holder freezes. It may stop at any point: none
 * of these is forced by fairness. */
#define EVENTS(c) \
  :: d_step { ev > 0 && ph[c] == WAIT -> remove(c); ph[c] = DONE; ev-- } \
  :: d_step { ev > 0 && (ph[c] == WAIT || ph[c] == HELD) -> ph[c] = FROZEN; ev-- }

proctype env() {
  do
  EVENTS(0)
  EVENTS(1)
  EVENTS(2)
  EVENTS(3)
  :: break
  od
}

init {
  atomic {
    /* the modes, in creation order: a reader or a permit, a writer or a
     * permit, a reader or a permit, a permit */
    if :: md[0] = SH :: md[0] = LM fi;
    if :: md[1] = EX :: md[1] = LM fi;
    if :: md[2] = SH :: md[2] = LM fi;
    md[3] = LM;
    seen[0] = NONE; seen[1] = NONE; seen[2] = NONE; seen[3] = NONE;
    run client(0); run client(1); run client(2); run client(3);
    run env()
  }
}

#define stuck(c) (waiting(c) && adm[c])
ltl live { [] ((stuck(0) -> <> !waiting(0)) && (stuck(1) -> <> !waiting(1)) &&
               (stuck(2) -> <> !waiting(2)) && (stuck(3) -> <> !waiting(3))) }
