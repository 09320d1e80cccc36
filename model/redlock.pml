/* redlock.pml: Redlock's quorum grant and token commit over 3 nodes
 * (redlock's backend.Try, lease.Release and lease.finish, and the
 * redisproto quorum scripts), two clients racing for a key as RunOnce
 * replicas.
 *
 * Mirrors:
 *   redlock/acquire.go  Try            phase one: a grant, with the attempt's
 *                                      proposal, to every node; a majority
 *                                      of grants wins; the proposal is the
 *                                      token when a majority recorded it,
 *                                      else phase two commits the highest
 *                                      floor + 1 on the granting nodes and
 *                                      needs a majority; no validity left
 *                                      -> released, transient (noValidity)
 *                       settle, countRefusals, undecided
 *                                      phase one waits for more answers
 *                                      while they cannot tell a holder
 *                                      from a split vote
 *                       acquireError, splitVote
 *                                      most silent -> transient; no owner
 *                                      on, or able to be on, a majority ->
 *                                      split vote, transient; else held
 *                                      (ErrNotAcquired)
 *                       cleanup        a failed attempt releases every node
 *                                      but those that refused it
 *                       finish         a straggling grant of a failed or
 *                                      released attempt is released again,
 *                                      unless the node's answer to Release
 *                                      says it released it (releasedAfter)
 *   redlock/quorum.go   tally, fanOut  the answers as they come; a node not
 *                                      heard when the client stops waiting
 *                                      is "no answer", its request lives on
 *   redlock/lease.go    Release        every node; released at a majority
 *                       Settle         a wait only (see Abstracted away)
 *   redlock/proposal.go proposer.next  a proposal, or none (0)
 *   redisproto/lua/quorum_grant.lua    free -> the lease; floor = counter;
 *                                      a proposal above it is recorded in
 *                                      the lease and the counter; held by
 *                                      another owner -> refused
 *   redisproto/lua/quorum_commit.lua   still the owner's -> token in the
 *                                      lease, counter = max(counter, token)
 *   redisproto/lua/quorum_release.lua  compare-and-release by owner
 *   runonce.go          RunOnce        each client: retry on ErrTransient
 *                                      (ATT attempts), skip on
 *                                      ErrNotAcquired, run on a grant
 *
 * Set-up: the key was just released by a previous holder X (token 1,
 * counters 1 on every node): its release reached nodes 0 and 1, so its
 * Release returned, and its lease is still on node 2 until its release
 * there lands (a releasing holder's straggler). Two clients then race,
 * each with ATT attempts, a fresh owner per attempt. Client 0 proposes
 * in every attempt (it has a measure of the nodes' clocks); client 1, a
 * fresh Locker, proposes nothing in its first attempt and commits. A
 * proposal is one above the highest counter when the attempt starts.
 *
 * Network: each request runs on its node in one step (a script is
 * atomic there), in any order with the other requests, and may run after
 * the attempt that sent it has ended (a straggler), or after a later
 * release (a grant overtaking its release). A reply reaches a waiting
 * client in the step its request runs, and the client reacts in that
 * step (tally returns as the deciding answer arrives); a grant that runs
 * after its client stopped waiting has its reply delivered later, to
 * finish. Per client and node, one grant-or-commit and one release are
 * in flight at a time: a client's next attempt starts once its previous
 * grants have landed or been lost, and a release is sent once the
 * previous release to that node has been answered or lost. A client
 * stops waiting (the node timeout) only for answers that cannot come
 * (lost), and TMO times more (0: see Found).
 *
 * Faults, at most FAULTS (1) in all:
 *   - a lost message: a grant request, a grant's reply (the grant ran), or
 *     a release request, to node 0 or 2 (nodes 0 and 1 are symmetric);
 *   - a restart of node 0 without persistence, while one client holds and
 *     the other has no attempt in progress. The design's assumption
 *     (docs/redlock.md, Fencing token: "keep a crashed node down for
 *     longer than the largest TTL"; doc.go lists the unsafe case under
 *     Not guaranteed) is modelled: the node rejoins after the longest TTL
 *     and MaxProposalLead, so every lease that existed at the crash has
 *     expired on every node, every validity then live has ended, and the
 *     node's clock, its floor once its counter is gone, is above every
 *     token proposed or committed (ctr := maxTok). Mutant 4 drops the
 *     assumption: mutual exclusion and the tokens' order both break.
 *
 * Timing, as order only:
 *   - win[c] is client c's validity, TTL - elapsed - drift counted from
 *     the start of the attempt, before its first request: a grant is
 *     returned only while it is live; it ends at the release (or at a
 *     restart).
 *   - A holder's validity ends before any node's lease of its grant ends:
 *     leases expire only as a restart assumes, and X's, whose release is
 *     in flight. A lease that a lost message left behind outlives the
 *     run (its TTL is longer). Mutant 6 lets a lease expire while its
 *     owner's validity is live.
 *   - Counters are kept for TTL + FenceRetention: they never expire here.
 *
 * Abstracted away: the nodes' clocks (floor = counter: the clock only
 * raises floors; the MaxProposalLead check on recording), renewals,
 * waiters, reservations and wake-ups (no blocking Acquire), release
 * markers and receipts (a release of a lease that is not there answers
 * 0; nothing retries a release), error answers (a node that is down is
 * silent), a request run twice by a client's resend (the "mine" branch
 * of quorum_grant.lua), lost commits and lost replies to commits and
 * releases, Settle's grace (a wait: what it waits for may come before or
 * after the next step), Break, List, the core's backoff (order only).
 *
 * Properties (assertions):
 *   excl:    at most one holder whose validity is live;
 *   fence:   a returned token is above every token returned before, and
 *            at or below the counter of every node of a majority;
 *   held:    ErrNotAcquired only when some owner was on a majority of
 *            nodes at once, or nodes that did not answer could make one
 *            (the design's "Held means an owner on a majority");
 *   period:  RunOnce's period is not skipped by both replicas unless some
 *            owner had a majority, or a skip counted unknown nodes;
 *   regrant: a released key can be granted again: once nothing else can
 *            move (the model has no cycles: every run ends, so this end
 *            state check is the liveness claim), every node is free,
 *            unless a message was lost (what it left expires with its
 *            TTL). Without it, cleanup, Release and finish leave nothing.
 *
 * Found: with -DTMO=1 (a client may also stop waiting, once, while a
 * grant is in flight) "held" fails, no fault needed. Client 1's first
 * attempt hears no node in time (3 silent: transient) and releases all
 * three in the background; its grants run late: on node 1, until its
 * cleanup release lands there, and on node 0 after the cleanup release
 * for node 0 overtook it, until finish's re-release lands. Client 0's
 * grants run in between: refused on node 2 (X), on node 1 and then on
 * node 0 by that same failed owner. Every node answered and one owner
 * was seen on two: ErrNotAcquired, and replica 0 skips the period,
 * though that owner never held two nodes at once (client 1's second
 * attempt meets a split vote and gives up: nobody runs). "period" (both
 * skip) still holds with TMO=1 (29.6M states, no fault).
 *
 * Found, also without TMO: "held" as checked by default allows a
 * NotAcquired verdict once any owner has been on a majority at some point
 * of the run. Checked per attempt (-DSTRICT_HELD=1: an owner on a
 * majority since the attempt began), it fails with no fault and no early
 * timeout: client 0's lease wins nodes 0 and 1 while its grant to node 2
 * is in flight; its Release reaches nodes 1 and 0 and succeeds; its late
 * grant then takes node 2 (finish re-releases it later). Client 1's next
 * attempt sees that owner on node 0, then on node 2, never on both at
 * once, every node answering: splitVote reports ErrNotAcquired on a key
 * nobody holds. A spurious refusal right after a release; safety holds.
 */
#ifndef MUTANT
#define MUTANT 0
#endif
//@ mutant 1 the split-vote judgement of 68f3540 (contenders(): a split vote only when every refusal is a lease without a token; no settle), fixed by 4e85a89: X's straggling lease beside two contenders' minorities reads as held, ErrNotAcquired with no owner on a majority
//@ mutant 2 the proposed token is used without a majority recording it (no commit round): a token at or below one returned before
//@ mutant 3 the commit is confirmed by one node, fewer than a majority: a returned token above a majority's counters (a later commit repeats it)
//@ mutant 4 a node restarted without persistence rejoins at once (keys and counter lost, validities live): two valid holders, tokens go back
//@ mutant 5 the judgement before 68f3540 (any refusal means held): contenders' minorities read as held, ErrNotAcquired with no owner on a majority
//@ mutant 6 a holder's validity outlives its lease (no drift allowance): a node's lease expires while its owner's validity is live, and two holders are valid

#define NN 3        /* nodes */
#define NC 2        /* clients */
#define Q 2         /* quorum */
#define ATT 2       /* attempts per client */
#define X 5         /* the previous holder; clients' owners are 1..4 */
#define FAULTS 1    /* faults in all: a lost message, or a restart */
#ifndef TMO
#define TMO 0       /* waits cut short, beyond those a loss forces */
#endif
#ifndef STRICT_HELD
#define STRICT_HELD 0 /* "held" per attempt (see Found) */
#endif

#define I(c,n) ((c)*NN+(n))

/* The nodes: the lease (owner, 0: free or a release marker; whether its
 * value carries a token) and the fencing counter. */
byte hold[NN];
bool htk[NN];
byte ctr[NN];

/* Per client and node, the requests in flight: one grant or commit, and
 * one release. */
#define IDLE 0
#define GREQ 1      /* grant request in flight */
#define GREP 2      /* grant ran after the client stopped waiting for it:
                     * its reply in flight (a straggler) */
#define CREQ 3      /* commit request in flight */
#define RREQ 1      /* release request in flight */
byte gs[NC*NN];
byte rs[NC*NN];
byte rown[NC*NN];   /* the owner a release is for */
bool rrel[NC*NN];   /* the release is the lock's Release (not a cleanup) */
bool gok[NC*NN];    /* a straggler's reply: granted */

/* The clients. */
#define PIDLE 0     /* between attempts */
#define P1 1        /* phase one: collecting grants */
#define CM 2        /* phase two: collecting commits */
#define HOLD 3
#define RL 4        /* Release: collecting answers */
#define CLEAN 5     /* failed: its cleanup waits for a release slot */
#define DONE 6
byte ph[NC];
byte own[NC];       /* the attempt's owner */
byte prop[NC];      /* its proposal, 0: none */
byte tokc[NC];      /* its commit token */
bool win[NC];       /* its validity window is open */
bool gone[NC];      /* lease.released, or phase one failed */
bool failed1[NC];   /* phase one failed */
bool relcalled[NC]; /* Release was called (lease.releases != nil) */
byte clm[NC];       /* nodes a failed attempt releases (lease.cleanup) */
byte vc[NC];        /* a failed attempt's verdict, until its cleanup */
/* Phase one's answers as taken: 0 none yet, 1 granted, 2 refused, 3 no
 * answer (the client stopped waiting). */
byte ans[NC*NN];
byte who[NC*NN];    /* refused: by whom */
byte oks[NC];       /* granted */
byte nref[NC];      /* refused */
byte most[NC];      /* the most refusals by one owner */
byte nno[NC];       /* no answer */
bool rtok[NC];      /* a refusing lease carries a token (mutant 1) */
byte nrec[NC];
byte flmax[NC];
bool relok[NC*NN];  /* the Release's answer from the node: released */
byte cok[NC], cpend[NC];  /* phase two's tally */
byte rokc[NC], rpend[NC]; /* Release's tally */
#define RAN 1
#define SKIP 2
#define GAVEUP 3
byte out[NC];

/* Budgets and ghosts. */
byte faults = 0, tmo = 0;
bool lost;          /* a message was lost */
byte maxRet = 1;    /* the highest token returned (X's: 1) */
byte maxTok = 1;    /* the highest token proposed or committed */
bool majAny;        /* some owner was on a majority of nodes at once */
bool majSince[2];   /* ... since client c's attempt began (STRICT_HELD) */
bool silentSkip;    /* a NotAcquired verdict counted unknown nodes */

#define ANS(c,n,x) (ans[I(c,n)] == (x))
/* countRefusals, kept as the answers are taken: refusing (nref), most
 * (the most nodes one owner was seen on), unknown (not answered, or no
 * answer). */
#define UNKNOWN(c) (NN - oks[c] - nref[c])
#define PEND(c) (UNKNOWN(c) - nno[c])
/* how many nodes refused for the owner that node n refused for */
#define SEEN(c,n) ((who[I(c,0)] == hold[n]) + (who[I(c,1)] == hold[n]) + (who[I(c,2)] == hold[n]))
/* refusals.undecided: no owner seen on a majority, but one could be. */
#define UNDEC(c) (nref[c] > 0 && most[c] < Q && most[c] + UNKNOWN(c) >= Q)
#if MUTANT == 1 || MUTANT == 5
/* Before 4e85a89: tally alone, no settle. */
#define DEC1(c) (oks[c] >= Q || oks[c] + PEND(c) < Q)
#else
/* tally, then settle while undecided. */
#define DEC1(c) (oks[c] >= Q || (oks[c] + PEND(c) < Q && !UNDEC(c)))
#endif
#if MUTANT == 3
#define NEEDC 1
#else
#define NEEDC Q
#endif
#define DECC(c) (cok[c] >= NEEDC || cok[c] + cpend[c] < NEEDC)
#define DECR(c) (rokc[c] >= Q || rokc[c] + rpend[c] < Q)
#define MAXC (ctr[0] > ctr[1] -> (ctr[0] > ctr[2] -> ctr[0] : ctr[2]) : (ctr[1] > ctr[2] -> ctr[1] : ctr[2]))
#define ON(o) ((hold[0] == (o)) + (hold[1] == (o)) + (hold[2] == (o)))
#define RIDLE(c,m) ((!((m) & 1) || rs[I(c,0)] == IDLE) && (!((m) & 2) || rs[I(c,1)] == IDLE) && \
                    (!((m) & 4) || rs[I(c,2)] == IDLE))
/* The client may stop waiting for phase one's answers (the node
 * timeout) TMO times in all; in any phase it stops waiting for answers
 * that cannot come (their request or reply was lost). */
#define GFLY(c) (gs[I(c,0)] == GREQ || gs[I(c,1)] == GREQ || gs[I(c,2)] == GREQ)
#define RFLY(c) ((rs[I(c,0)] == RREQ && rrel[I(c,0)]) || (rs[I(c,1)] == RREQ && rrel[I(c,1)]) || \
                 (rs[I(c,2)] == RREQ && rrel[I(c,2)]))

/* contenders() before 4e85a89: every refusal is a lease without a token. */
#define CONTENDERS(c) (nref[c] > 0 && !rtok[c])

/* Verdicts. */
#define VHELD 1
#define VTRANS 2

/* The client's reactions run in the step that brings the deciding answer
 * (tally returns as the answer arrives). */

/* Once a client is done and has nothing in flight, its attempt's
 * variables are reset (fewer states). */
#define QUIET(c) (gs[I(c,0)] == IDLE && gs[I(c,1)] == IDLE && gs[I(c,2)] == IDLE && \
                  rs[I(c,0)] == IDLE && rs[I(c,1)] == IDLE && rs[I(c,2)] == IDLE)
inline tidy(c) {
  if
  :: ph[c] == DONE && QUIET(c) ->
     own[c] = 0; prop[c] = 0; tokc[c] = 0; gone[c] = false; failed1[c] = false; relcalled[c] = false;
     relok[I(c,0)] = false; relok[I(c,1)] = false; relok[I(c,2)] = false
  :: else
  fi
}

/* The client's last step: RunOnce's period (see Properties). */
inline ended(c) {
  ph[c] = DONE; tidy(c);
  assert(out[1-c] == 0 || !(out[0] == SKIP && out[1] == SKIP) || majAny || silentSkip)
}

/* A release of owner own[c] to the nodes in mask m (their slots idle). */
inline sendRelease(c, m, isRel) {
  if :: (m) & 1 -> rs[I(c,0)] = RREQ; rown[I(c,0)] = own[c]; rrel[I(c,0)] = isRel :: else fi;
  if :: (m) & 2 -> rs[I(c,1)] = RREQ; rown[I(c,1)] = own[c]; rrel[I(c,1)] = isRel :: else fi;
  if :: (m) & 4 -> rs[I(c,2)] = RREQ; rown[I(c,2)] = own[c]; rrel[I(c,2)] = isRel :: else fi
}

/* After a failed attempt's cleanup: skip on ErrNotAcquired, else retry. */
inline afterFail(c) {
  clm[c] = 0;
  if
  :: vc[c] == VHELD -> out[c] = SKIP; vc[c] = 0; ended(c)
  :: else -> vc[c] = 0; ph[c] = PIDLE
  fi
}

/* lease.cleanup: release, in the background, what the attempt may have
 * left; now, or once the release slots are free. */
inline cleanup(c) {
  gone[c] = true; win[c] = false;
  if
  :: RIDLE(c, clm[c]) -> sendRelease(c, clm[c], false); afterFail(c)
  :: else -> ph[c] = CLEAN
  fi
}

/* The grant is returned with token t while the window is open; else it
 * is released (noValidity, transient). */
inline grantReturn(c, t) {
  if
  :: win[c] ->
     /* excl */
     assert(!(ph[1-c] == HOLD && win[1-c]));
     /* fence */
     assert(t > maxRet);
     assert((ctr[0] >= t) + (ctr[1] >= t) + (ctr[2] >= t) >= Q);
     maxRet = t;
     ph[c] = HOLD; out[c] = RAN; clm[c] = 0
  :: else -> vc[c] = VTRANS; cleanup(c)
  fi
}

/* Phase one decided: the verdict (Try, acquireError). */
inline verdict(c) {
  clm[c] = (!ANS(c,0,2) -> 1 : 0) + (!ANS(c,1,2) -> 2 : 0) + (!ANS(c,2,2) -> 4 : 0);
  if
  :: oks[c] >= Q ->
     if
#if MUTANT == 2
     :: prop[c] != 0 -> grantReturn(c, prop[c])
#else
     :: prop[c] != 0 && nrec[c] >= Q -> grantReturn(c, prop[c])
#endif
     :: else ->
        /* Phase two: commit the highest floor + 1 on the nodes that
         * granted. */
        tokc[c] = flmax[c] + 1;
        maxTok = (tokc[c] > maxTok -> tokc[c] : maxTok);
        if :: ANS(c,0,1) -> gs[I(c,0)] = CREQ; cpend[c]++ :: else fi;
        if :: ANS(c,1,1) -> gs[I(c,1)] = CREQ; cpend[c]++ :: else fi;
        if :: ANS(c,2,1) -> gs[I(c,2)] = CREQ; cpend[c]++ :: else fi;
        ph[c] = CM
     fi
  :: else ->
     /* acquireError */
     if
     :: nno[c] > NN - Q -> vc[c] = VTRANS
     :: else ->
#if MUTANT == 5
        vc[c] = VHELD
#elif MUTANT == 1
        /* contenders(): a split vote only when every refusal is a lease
         * without a token. */
        if
        :: CONTENDERS(c) -> vc[c] = VTRANS
        :: else -> vc[c] = VHELD
        fi
#else
        /* splitVote */
        if
        :: most[c] + UNKNOWN(c) >= Q || nref[c] == 0 -> vc[c] = VHELD
        :: else -> vc[c] = VTRANS
        fi
#endif
        /* held: ErrNotAcquired only when an owner was on a majority, or
         * the nodes that did not answer could make one. */
#if STRICT_HELD
        assert(vc[c] != VHELD || majSince[c] || UNKNOWN(c) > 0);
#else
        assert(vc[c] != VHELD || majAny || UNKNOWN(c) > 0);
#endif
        if :: vc[c] == VHELD && UNKNOWN(c) > 0 -> silentSkip = true :: else fi
     fi;
     failed1[c] = true;
     cleanup(c)
  fi;
  ans[I(c,0)] = 0; ans[I(c,1)] = 0; ans[I(c,2)] = 0;
  who[I(c,0)] = 0; who[I(c,1)] = 0; who[I(c,2)] = 0;
  nref[c] = 0; most[c] = 0; nno[c] = 0; rtok[c] = false;
  oks[c] = 0; nrec[c] = 0; flmax[c] = 0
}

/* Phase two decided. */
inline commitVerdict(c) {
  if
  :: cok[c] >= NEEDC -> cok[c] = 0; cpend[c] = 0; grantReturn(c, tokc[c])
  :: else ->
     /* a majority granted, but the commit missed one: transient */
     cok[c] = 0; cpend[c] = 0; vc[c] = VTRANS; cleanup(c)
  fi
}

/* Release decided (released, or ErrNotHeld / ErrUnavailable). */
inline releaseVerdict(c) {
  rokc[c] = 0; rpend[c] = 0; ended(c)
}

proctype client(byte c) {
  byte k = 0;   /* attempts made */
end:
  do
  :: atomic {
       ph[c] == PIDLE && k < ATT &&
       gs[I(c,0)] == IDLE && gs[I(c,1)] == IDLE && gs[I(c,2)] == IDLE ->
       /* Try: a fresh owner, a proposal, a grant to every node. */
       k++;
       own[c] = c * ATT + k;
       majSince[c] = false;
       win[c] = true; gone[c] = false; failed1[c] = false; relcalled[c] = false;
       relok[I(c,0)] = false; relok[I(c,1)] = false; relok[I(c,2)] = false;
       tokc[c] = 0;
       /* proposer.next: client 0 has a measure of the nodes' clocks;
        * client 1, a fresh Locker, proposes nothing in its first
        * attempt. A proposal is above every counter now (the clocks
        * moved on); it may be overtaken before it lands. */
       if
       :: c == 0 || k > 1 -> prop[c] = MAXC + 1; maxTok = (prop[c] > maxTok -> prop[c] : maxTok)
       :: else -> prop[c] = 0
       fi;
       gs[I(c,0)] = GREQ; gs[I(c,1)] = GREQ; gs[I(c,2)] = GREQ;
       ph[c] = P1
     }
  :: d_step { ph[c] == PIDLE && k == ATT -> out[c] = GAVEUP; ended(c) }
  /* The client stops waiting: the nodes not heard count as no answer,
   * their requests live on. */
  :: d_step { ph[c] == P1 && !DEC1(c) && (tmo < TMO || !GFLY(c)) ->
       if :: GFLY(c) -> tmo++ :: else fi;
       if :: ANS(c,0,0) -> ans[I(c,0)] = 3 :: else fi;
       if :: ANS(c,1,0) -> ans[I(c,1)] = 3 :: else fi;
       if :: ANS(c,2,0) -> ans[I(c,2)] = 3 :: else fi;
       nno[c] = NN - oks[c] - nref[c];
       verdict(c) }
  :: d_step { ph[c] == RL && !DECR(c) && !RFLY(c) -> releaseVerdict(c) }
  :: d_step { ph[c] == CLEAN && RIDLE(c, clm[c]) -> sendRelease(c, clm[c], false); afterFail(c) }
  /* Release: to every node; released at a majority. */
  :: d_step { ph[c] == HOLD && RIDLE(c, 7) ->
       relcalled[c] = true; gone[c] = true; win[c] = false;
       sendRelease(c, 7, true);
       rpend[c] = 3; ph[c] = RL }
  :: ph[c] == DONE -> break
  od
}

/* lease.finish must release client c's straggling grant from node n. */
#define NEEDREL(n) (gok[I(c,n)] && gone[c] && !(!failed1[c] && relcalled[c] && relok[I(c,n)]))

/* quorum_grant.lua, for client c at node n; taken (tk) into phase one's
 * answers, else kept as a straggler's reply (gok). */
inline grant(n, tk) {
  assert(hold[n] != own[c]);   /* no request runs twice here */
  if
  :: hold[n] == 0 ->
     if
     :: tk ->
        ans[I(c,n)] = 1; oks[c]++;
        flmax[c] = (ctr[n] > flmax[c] -> ctr[n] : flmax[c]);
        if :: prop[c] > ctr[n] -> nrec[c]++ :: else fi
     :: else -> gok[I(c,n)] = true
     fi;
     if
     :: prop[c] > ctr[n] -> ctr[n] = prop[c]; htk[n] = true
     :: else -> htk[n] = false
     fi;
     hold[n] = own[c];
     if :: ON(own[c]) >= Q -> majAny = true; majSince[0] = true; majSince[1] = true :: else fi
  :: else ->
     if
     :: tk ->
        ans[I(c,n)] = 2; who[I(c,n)] = hold[n]; nref[c]++;
        if :: htk[n] -> rtok[c] = true :: else fi;
        most[c] = (SEEN(c,n) > most[c] -> SEEN(c,n) : most[c])
     :: else
     fi
  fi
}

/* quorum_commit.lua */
inline commit(n) {
  if
  :: hold[n] == own[c] ->
     htk[n] = true; ctr[n] = (tokc[c] > ctr[n] -> tokc[c] : ctr[n]);
     if :: ph[c] == CM -> cok[c]++ :: else fi
  :: else
  fi;
  if :: ph[c] == CM -> cpend[c]-- :: else fi
}

/* quorum_release.lua; counted: an answer to the lock's Release. */
inline release(n, counted) {
  if
  :: hold[n] == rown[I(c,n)] ->
     hold[n] = 0; htk[n] = false;
     if :: counted -> relok[I(c,n)] = true; if :: ph[c] == RL -> rokc[c]++ :: else fi :: else fi
  :: else
  fi;
  if :: counted && ph[c] == RL -> rpend[c]-- :: else fi
}

/* Losses: of requests and replies to nodes 0 and 2 (nodes 0 and 1 are
 * symmetric in the set-up). */
#define LOSE(n) (faults < FAULTS && n != 1)

/* The network and node n, for client c's requests to it. A request runs
 * on the node in one step (the script is atomic there), and its reply
 * reaches the client in the same step while the client waits for it (the
 * client reacts in that step: tally returns as the deciding answer
 * arrives); a grant that runs after the client stopped waiting for it
 * has its reply delivered later, to lease.finish, which waits for the
 * verdict, and for the node's answer to a release in flight
 * (releasedAfter). Lost: a grant request, or its reply (the grant ran),
 * or a release request. */
proctype slot(byte c; byte n) {
end:
  do
  :: d_step { gs[I(c,n)] == GREQ ->
       if
       :: ph[c] == P1 && ans[I(c,n)] == 0 ->
          gs[I(c,n)] = IDLE; grant(n, true);
          if :: DEC1(c) -> verdict(c) :: else fi
       :: else -> gs[I(c,n)] = GREP; grant(n, false)
       fi }
  :: d_step { gs[I(c,n)] == GREQ && LOSE(n) -> faults++; lost = true; gs[I(c,n)] = IDLE; tidy(c) }
  :: d_step { gs[I(c,n)] == GREQ && LOSE(n) ->
       faults++; lost = true; gs[I(c,n)] = IDLE; grant(n, false); gok[I(c,n)] = false; tidy(c) }
  :: d_step { gs[I(c,n)] == GREP && ph[c] != P1 && (!NEEDREL(n) || rs[I(c,n)] == IDLE) ->
       if
       :: NEEDREL(n) -> rs[I(c,n)] = RREQ; rown[I(c,n)] = own[c]; rrel[I(c,n)] = false
       :: else
       fi;
       gs[I(c,n)] = IDLE; gok[I(c,n)] = false; tidy(c) }
  :: d_step { gs[I(c,n)] == CREQ ->
       gs[I(c,n)] = IDLE; commit(n);
       if :: ph[c] == CM && DECC(c) -> commitVerdict(c) :: else fi }
  :: d_step { rs[I(c,n)] == RREQ ->
       rs[I(c,n)] = IDLE;
       release(n, rrel[I(c,n)] && rown[I(c,n)] == own[c]);
       rown[I(c,n)] = 0; rrel[I(c,n)] = false;
       if :: ph[c] == RL && DECR(c) -> releaseVerdict(c) :: else fi;
       tidy(c) }
  :: d_step { rs[I(c,n)] == RREQ && LOSE(n) ->
       faults++; lost = true; rs[I(c,n)] = IDLE; rown[I(c,n)] = 0; rrel[I(c,n)] = false; tidy(c) }
  od
}

/* Leases expire (TTL) only as a restart assumes (below), and X's, whose
 * release is in flight in the set-up: a lease a lost message left
 * behind outlives the rest of the run. */
#if MUTANT == 6
#define EXPIRABLE(n) (hold[n] == X || (hold[n] != 0 && ((hold[n] == own[0] && win[0]) || (hold[n] == own[1] && win[1]))))
#else
#define EXPIRABLE(n) (hold[n] == X)
#endif
#define EXPIRE(n) d_step { EXPIRABLE(n) -> hold[n] = 0; htk[n] = false }
#define RSTOK ((ph[0] == HOLD && (ph[1] == PIDLE || ph[1] == DONE)) || (ph[1] == HOLD && (ph[0] == PIDLE || ph[0] == DONE)))
/* A restart: the node rejoins after the longest TTL, so every lease that
 * existed when it crashed has expired, on every node, and every window
 * then open has closed; its counter is gone, and its clock, its floor
 * now, is above every token proposed or committed. */
#if MUTANT == 4
#define RESTART(n) d_step { faults < FAULTS && RSTOK -> faults++; hold[n] = 0; htk[n] = false; ctr[n] = 0 }
#else
#define RESTART(n) d_step { faults < FAULTS && RSTOK -> faults++; ctr[n] = maxTok; \
                            hold[0] = 0; hold[1] = 0; hold[2] = 0; htk[0] = false; htk[1] = false; htk[2] = false; \
                            win[0] = false; win[1] = false }
#endif

/* Time: leases expire, a node restarts. */
proctype env() {
end:
  do
  :: EXPIRE(0)
  :: EXPIRE(1)
  :: EXPIRE(2)
  :: RESTART(0)
  od
}

/* regrant: once nothing else can move (the model has no cycles: every
 * run ends), the key is free on every node, unless a message was lost
 * (what it left behind expires with its TTL). */
proctype regrant() {
  timeout -> assert(lost || (hold[0] == 0 && hold[1] == 0 && hold[2] == 0))
}

init {
  atomic {
    ctr[0] = 1; ctr[1] = 1; ctr[2] = 1;
    hold[2] = X; htk[2] = true;
    run regrant(); run env();
    run slot(0, 0); run slot(0, 1); run slot(0, 2);
    run slot(1, 0); run slot(1, 1); run slot(1, 2);
    run client(0); run client(1)
  }
}
