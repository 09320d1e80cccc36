// Package pglock is dlock's PostgreSQL backend, on pgx (pgxpool).
//
//	pool, err := pgxpool.New(ctx, "postgres://app@db/app")
//	...
//	locker := pglock.New(pool)
//	lk, err := locker.Acquire(ctx, "nightly-batch")
//
// A lease is a row of one table (DefaultTable, or WithTable's); shared
// and limited holders have a row each in "<table>_holders", waiting
// writers in "<table>_writers". A Locker creates them on first use
// (versioned SQL in migrations/, recorded in MigrationsTable) unless
// WithoutMigrate is given; Migrate runs the migrations explicitly. Every
// operation is one statement in its own transaction (an attempt that
// raced other grants twice: a short transaction holding the key's row),
// with no session state, so a Locker works behind PgBouncer in
// transaction pooling mode, also on a pool with pgx's default
// configuration. Expiry is by the database's clock, tokens come from the
// table's sequence, and an attempt on a held key is a read. A blocking
// exclusive Acquire that is refused keeps new shared requests out while
// it waits (writer preference). Waiters are woken by LISTEN/NOTIFY on one connection per
// Locker, outside the pool, and poll meanwhile (only poll through a
// pooler or with WithoutListen). Guard fences writes inside the writer's
// own transaction.
//
// The tables and the privileges an application role needs, the
// statements, writer preference, Abort, wake-ups, breaks and the Guard
// are described in docs/pglock.md.
//
// # Guarantees
//
//   - Mutual exclusion on one primary: a key has one live exclusive owner
//     and no other holder, or only shared holders, or at most its limit of
//     limited holders.
//   - Tokens strictly increase each time a key is granted, across
//     restarts; a writer's token is above every earlier holder's.
//   - Lost() closes before the row can expire by the database's clock, as
//     long as the client's clock does not run more than a few percent slow
//     against the server's (the drift allowance). A client's wrong clock
//     cannot shorten or lengthen a lease.
//   - Every call returns by its context's deadline, also when the server
//     hangs; each statement is also bounded by WithRequestTimeout. A wait
//     that ends while PostgreSQL does not answer reports an outage, not a
//     held key. An attempt, renewal or release whose connection was
//     refused or reset, or that PostgreSQL or PgBouncer turned away for
//     want of a connection (SQLSTATE class 08, 53300, 57P01-57P03), fails
//     with an error wrapping dlock.ErrUnavailable and pgx's.
//   - A dlock.Break reaches the broken holder at once: a lock held for
//     more than 100 ms listens for Break's notice, and its Lost() closes a
//     round trip after the notice arrives (a break while the LISTEN
//     connection is down, when it is opened again). Through a pooler, with
//     WithoutListen, or for a break by an older pglock, the next renewal
//     finds the break.
//
// # Not guaranteed
//
//   - Fair ordering: waiters are not queued. A release wakes one
//     listening waiting writer (the registration that expires first) when
//     writers wait, else every waiter of the key, and a newcomer's
//     attempt can still take the key first.
//     A dead waiting writer keeps readers out for up to one TTL after its
//     last registration, and may be the one a release wakes: the others
//     then find the key by polling.
//   - Failover: a lease written to a primary that fails before its
//     replica has it is lost with it; locks need the primary (a read-only
//     standby is refused with an error saying so).
//   - Bounded table size: one row stays per key ever locked. Delete by
//     hand only rows released or expired long ago (an acquire in flight
//     can insert a token below a row deleted meanwhile).
//   - Durability with synchronous_commit = off (or fsync off): a server
//     crash can lose acknowledged grants and the sequence's advance, so a
//     key can be granted again with a token already used.
//   - Metadata holding a NUL byte (jsonb cannot store one): refused with an
//     error wrapping dlock.ErrInvalidOption.
//   - Mixed versions: a pglock from before migration 2 ignores shared and
//     limited holders; stop every older client of a table before any
//     client takes a shared or limited lock on it.
//   - Attempts that arrive very late: an acquire or writer registration
//     held by the network for more than five minutes after its Abort or
//     Leave, or whose Abort never reached the server, leaves a lease or
//     registration that ends at its TTL.
//   - A Locker that holds a lock for long keeps one server connection of
//     its own (the LISTEN connection) besides the pool.
package pglock
