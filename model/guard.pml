/* guard.pml: guard admission (dlock.FenceRecord.Admit, fence.go).
 *
 * Mirrors:
 *   fence.go  FenceRecord.Admit   the rule every guard applies (guard.Memory,
 *                                 filelock.Guard, redislock.Guard's script,
 *                                 etcdlock.Guard, zklock.Guard, pglock.Guard)
 * The lock service is abstract: a grant takes the key's next token (every
 * backend does, in every mode); an exclusive grant needs no live holder, a
 * shared or limited one no live exclusive holder (limited holders are
 * shared fences to a guard: Fence.Shared is set for both, and the permit
 * count does not enter the rule, so LIMIT only bounds how many hold).
 *
 * Timing, as the order the design relies on: a holder's lease can end
 * while the holder still runs (a pause past its TTL); the holder then
 * uses its old fence at any later point. Nothing else about time enters.
 *
 * Abstracted away: the store behind the guard (a write is one atomic
 * check-and-apply on the record, as every guard makes it), reads versus
 * writes (a shared holder's use is admitted like a write), owners reused
 * across grants (each grant has its own owner), the re-admission of the
 * same exclusive fence (again: covered by the owner rule, which the
 * model keeps).
 *
 * Properties (assertions):
 *   stale:  an exclusive use is applied only if no fence of a later grant,
 *           in any mode, was applied before it;
 *   valid:  a holder whose lease is live is always admitted (holders valid
 *           together are admitted together).
 */
#ifndef MUTANT
#define MUTANT 0
#endif
//@ mutant 1 shared fences are not recorded: a writer that paused past its lease is admitted after a newer reader used the resource
//@ mutant 2 a shared fence must be above every token seen: a reader granted before another reader that used the resource is refused while its lease is live

#define N 3        /* clients */
#define GRANTS 4   /* grants in all */
#define USES 2     /* uses of the resource per grant */

/* The guard's record. */
byte exTok = 0;    /* FenceRecord.Exclusive.Token */
byte exOwner = 0;  /* FenceRecord.Exclusive.Owner (grant number; 0: none) */
byte seen = 0;     /* FenceRecord.Seen */

/* The lock service. */
byte next = 0;          /* the key's last token, and the grants so far */
bool live[N];           /* client i's lease is live */
bool excl[N];           /* client i holds exclusively */
byte tok[N];            /* client i's token (its grant's) */

/* Ghost: the highest token the guard applied, in any mode. */
byte applied = 0;

inline admit(i, ok, s) {
  /* FenceRecord.Admit for client i's fence (Token tok[i], Owner =
   * the grant's number, which is its token, Shared = !excl[i]). */
  d_step {
    s = (seen > exTok -> seen : exTok);
    if
    :: !excl[i] ->
       if
#if MUTANT == 2
       :: tok[i] < s -> ok = false
#else
       :: tok[i] < exTok -> ok = false
#endif
       :: else ->
          ok = true;
#if MUTANT == 1
          skip            /* the rule before shared fences raised Seen */
#else
          seen = (s > tok[i] -> s : tok[i])
#endif
       fi
    :: else ->
       if
       :: tok[i] > s || (tok[i] == exTok && tok[i] == exOwner && s == tok[i]) ->
          ok = true; exTok = tok[i]; exOwner = tok[i]; seen = tok[i]
       :: else -> ok = false
       fi
    fi;
    s = 0
  }
}

proctype client(byte i) {
  byte u, s;
  bool ok;
  do
  :: true ->
     /* Acquire: exclusive when nobody holds, shared when no writer does. */
     if
     :: atomic { (next < GRANTS && !live[0] && !live[1] && !live[2]) ->
          next++; tok[i] = next; excl[i] = true; live[i] = true }
     :: atomic { (next < GRANTS && !(live[0] && excl[0]) && !(live[1] && excl[1]) && !(live[2] && excl[2])) ->
          next++; tok[i] = next; excl[i] = false; live[i] = true }
     :: next >= GRANTS -> break
     fi;
     u = 0;
     do
     :: u < USES ->
        u++;
        atomic {
          admit(i, ok, s);
          /* valid: a live holder is never refused. */
          assert(!live[i] || ok);
          if
          :: ok ->
             /* stale: an exclusive use after a later grant's fence. */
             assert(!excl[i] || applied <= tok[i]);
             applied = (applied > tok[i] -> applied : tok[i])
          :: else
          fi;
          ok = false
        }
     :: u < USES -> live[i] = false   /* the lease ends: a pause past the TTL, or a release */
     :: break
     od;
     live[i] = false;
     u = 0
  od
}

init {
  atomic {
    run client(0); run client(1); run client(2)
  }
}
