// Package pglock is dlock's PostgreSQL backend, on pgx (pgxpool).
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	...
//	locker := pglock.New(pool)
//	lk, err := locker.Acquire(ctx, "nightly-batch")
//
// # Table
//
// Leases are rows of one table (DefaultTable, or WithTable's): key, owner,
// token, expires_at, metadata. Shared and limited holders have a row each
// in "<table>_holders" (key, owner, mode, token, expires_at, released,
// metadata), and waiting writers one each in "<table>_writers" (key,
// waiter, expires_at). The tables and the token sequence are made by
// embedded, versioned migrations (migrations/*.sql: 0001 the lease table,
// 0002 the holders and writers tables and the lease table's gen, hmode and
// hlimit columns, added in place to an existing table), which a Locker
// runs on first use (serialized by a transaction-scoped advisory lock,
// recorded in MigrationsTable) unless WithoutMigrate is given; Migrate runs
// them explicitly, and the SQL can be run by hand. A Locker whose
// migrations are recorded already only reads MigrationsTable, so an
// application role needs no privilege to create tables: SELECT, INSERT and
// UPDATE on the lease table, SELECT, INSERT, UPDATE and DELETE on the
// holders and writers tables, USAGE on the sequence and SELECT on
// MigrationsTable (or WithoutMigrate, and no access to MigrationsTable).
// A table migrated to version 1 only is upgraded by the first Locker
// allowed to (or Migrate); until then every statement fails with an error
// saying to run it.
//
// # Statements
//
// Every operation is one statement in its own transaction (except an
// attempt whose statement raced other changes of the key's row twice,
// which reads again in a transaction holding the row's lock, bounded on
// the server by SET LOCAL timeouts): no session state (no session
// advisory lock, no prepared statement kept, no session-level SET), so
// a Locker works behind PgBouncer in transaction pooling mode (tested),
// also on a pool with pgx's default configuration: pglock runs its
// statements without pgx's statement cache (QueryExecModeExec where the
// pool says QueryExecModeCacheStatement; any other mode as configured).
//
//   - Acquire reads the key's live lease and reports its holder; only when
//     there is none does it insert the key's row or take over a row whose
//     lease expired or was released. An attempt on a held key is thus a
//     read: it locks no row, draws no token and writes nothing, so
//     waiters retrying do not queue behind the holder's release or
//     renewal. (A blocking Acquire that is refused also registers as a
//     waiting writer, below: a row of its own, not the holder's.)
//   - Expiry is by the database's clock: expires_at is clock_timestamp()
//     plus the TTL, computed by the server; the client's clock is never
//     sent, so a client with a wrong clock cannot shorten or lengthen a
//     lease. The holder counts its own local deadline from the time it
//     sent the statement, which is earlier than the server's clock read.
//   - Tokens come from the table's sequence, drawn while the row is locked
//     on a takeover, so a key's tokens increase in grant order. Rows are
//     never deleted by pglock (a release sets expires_at to -infinity), so
//     a key keeps its place in token order; sequences never go back, also
//     across a server crash.
//   - Renewal is one statement for every lock of the Locker due (one
//     UPDATE when all are exclusive), each extended only while its row is
//     still the owner's and not expired.
//   - Release marks the row released only if it is still the owner's live
//     lease, and NOTIFYs in the same statement; a retried release whose
//     first reply was lost finds its own released row and succeeds.
//
// Shared (dlock.WithShared) and limited (dlock.WithLimit) locks:
//
//   - Each holder is its own row in the holders table, with its own
//     owner, token, expiry (by the database's clock) and metadata, renewed,
//     released and aborted by owner-checked statements like an exclusive
//     lease; a holder that stops renewing expires alone.
//   - The key's row in the lease table gates every grant. A shared or
//     limited grant is one statement: it reads the key's holders, its
//     exclusive lease and its waiting writers from its snapshot and, if
//     the request may join (no exclusive holder; holders of its mode and,
//     for a limited one, its limit and fewer than it; for a shared one, no
//     waiting writer), upserts the key's row, under whose lock it draws
//     the token, bumps the row's gen and records the mode and limit
//     (hmode, hlimit), then inserts the holder's row. The upsert's
//     condition is checked on the row's latest version: no live exclusive
//     lease, and gen unchanged since the snapshot, so a decision taken on
//     holders that changed meanwhile is dropped and the statement is run
//     again (at most four times, then the key is reported held). An
//     exclusive takeover checks the same snapshot of holders and the same
//     gen. Renewing a holder locks its key's row (in key order within a
//     batch) and bumps gen, and extends the holder only if it is still
//     live at a time read after that lock: a renewal cannot slip past a
//     writer's snapshot, and one that comes after a writer took the key
//     finds its holder expired.
//   - Every grant of every mode draws the key's next token under the
//     key's row lock, so a writer's token is above every earlier
//     reader's, writer's or permit holder's.
//   - A request of another mode than the key's holders' is refused naming
//     them; a limited request with another limit is an error wrapping
//     dlock.ErrLimitMismatch naming both.
//   - Writer preference: after a refused attempt, a blocking exclusive
//     Acquire (Request.Waiter) registers as a waiting writer, in a
//     statement of its own: a row in the writers table expiring a TTL
//     from the database's clock, renewed by a later refused attempt once a
//     third of the TTL has passed (the engine attempts at least every
//     TTL/3). The writer's grant deletes it (and the key's expired ones)
//     in the grant's statement; Leave deletes it and wakes the key's
//     waiters. Both leave a released holder row under the waiter's id, so
//     a registration of that waiter delivered late (a stalled link) does
//     not register it again; it used to, keeping readers out for a TTL
//     after the writer had gone. While a live writer row exists, shared requests are
//     refused (limited ones are not). So a dead writer keeps readers out
//     for at most one TTL after its last registration. TryAcquire
//     registers nothing, and an uncontended Acquire runs the same single
//     statement as TryAcquire; an Acquire waiting for any holder writes
//     one small row every TTL/3 or so.
//   - Holder rows are kept five minutes after they end (so that a retried
//     release finds its own), then deleted by the key's next grant.
//   - Abort (an attempt whose outcome is unknown: its reply lost, its
//     context ended mid-statement) releases what the attempt was granted
//     and, in any mode, leaves a released holder row for the attempt's
//     owner: no grant goes to an owner with one, so the attempt's
//     statement, if a stalled link delivers it only after the Abort, takes
//     nothing (it used to take the key, for nobody, for a full TTL). An
//     attempt delivered more than five minutes after its Abort, or whose
//     Abort never reached the server, can still leave such a lease,
//     which expires at its TTL like a crashed holder's.
//
// Waiters are woken by LISTEN/NOTIFY on one connection per Locker and keep
// polling with the dlock.WithBackoff backoff meanwhile, so a notification
// lost (a broken connection) delays a waiter by one poll step at most.
// Through a connection pooler (PgBouncer, detected by the backend process
// ID the pooler hands out not being the server's) nothing is LISTENed:
// a LISTEN would stay on a server session shared with other clients,
// where NOTIFY never reaches the listener and the unasked-for
// notifications upset the pooler (PgBouncer 1.18 in transaction mode
// logged a warning for each and once exited); waiters poll. So they do
// when the server refuses the check (a role that may not run
// pg_backend_pid()). The LISTEN
// connection is opened outside the pool, with the pool's configuration
// and its BeforeConnect, AfterConnect and BeforeClose hooks, but not its
// OnNotification handler (so it does not count
// against MaxConns and waiting never shrinks the pool), when the Locker's
// first waiter subscribes; it stays open while someone waits or the
// Locker holds a lock for more than 100 ms (held locks listen for breaks:
// see Guarantees), and for two seconds after, for the Locker's next wait
// to reuse, then is closed. A Locker that holds a lock for long (a
// leader's) so keeps one server connection of its own besides the pool. One that stays silent for ten seconds is pinged,
// and abandoned and opened again if the server does not answer within the
// request timeout. Every waiter of a key is woken by its
// release (a shared or limited holder's too, and a waiting writer's
// Leave); they race for it.
//
// # Guarantees
//
//   - Mutual exclusion on one primary: a key has one live exclusive owner
//     and no other holder, or only shared holders, or at most its limit of
//     limited holders.
//   - Tokens strictly increase each time a key is granted, across
//     restarts.
//   - Lost() closes before the row can expire by the database's clock, as
//     long as the client's clock does not run more than a few percent slow
//     against the server's (the drift allowance).
//   - Every call returns by its context's deadline, also when the server
//     hangs; each statement is also bounded by WithRequestTimeout. A wait
//     that ends while PostgreSQL does not answer reports an outage, not a
//     held key. An attempt, renewal or release whose connection was
//     refused or reset, or that PostgreSQL or PgBouncer turned away for
//     want of a connection (SQLSTATE class 08, 53300, 57P01-57P03), fails
//     with an error wrapping dlock.ErrUnavailable and pgx's.
//   - A dlock.Break reaches the broken holder at once: Break sends a
//     notice of its own on the LISTEN channel, and the Locker of a lock
//     held for more than 100 ms then reads, in one statement, the rows of
//     its holders of that key, so the broken holder's Lost() closes a
//     round trip after the notice arrives (a read that fails is run
//     again every second), not at its next renewal. A break while the
//     LISTEN connection is down is found when it is opened again, when
//     the Locker reads the rows of all its listening locks in one
//     statement: about a second and a dial after a connection that
//     broke, and after up to ten seconds of silence and the request
//     timeout for one that hangs. A break by an older pglock, which sends
//     no break notice, is found by the next renewal.
//     Through a pooler (no LISTEN) or WithoutListen, the next renewal
//     finds the break.
//
// # Not guaranteed
//
//   - Fair ordering: waiters are not queued; apart from writer
//     preference, whoever attempts first after a release wins.
//   - Failover: a lease written to a primary that fails before its
//     replica has it is lost with it; locks need the primary (a read-only
//     standby is refused with an error saying so).
//   - Bounded table size: one row stays per key ever locked. Deleting
//     rows by hand keeps token order, with one narrow exception: a first
//     insert draws its token before it finds the key's row missing, so an
//     acquire in flight while a row is taken over, released and deleted
//     can insert a token below the deleted row's. Delete only rows
//     released or expired long ago.
//   - Durability with synchronous_commit = off (or fsync off): a server
//     crash can lose grants it acknowledged, and the sequence's advance
//     with them, so a key can be granted again to someone else, with a
//     token already used. Keep synchronous_commit on for the lease table's
//     database role or database.
//   - One waiter woken per release: all waiters of the key are.
//   - Metadata holding a NUL byte (jsonb cannot store one): Acquire
//     refuses it with an error wrapping dlock.ErrInvalidOption.
//   - Mixed versions: a pglock from before migration 2 (shared and
//     limited modes) does not read the holders table. Shared and limited
//     grants leave the key's lease row released, so such a client takes
//     the key exclusively while readers or permit holders are live. Stop
//     every older client of a table before any client takes a shared or
//     limited lock on it (exclusive locks alone are safe across versions).
//   - Attempts that arrive very late: an acquire or writer registration
//     held by the network for more than five minutes after its Abort or
//     Leave (the tombstone's life), or whose Abort never reached the
//     server, leaves a lease or registration that ends at its TTL.
package pglock
