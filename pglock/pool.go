package pglock

import "github.com/jackc/pgx/v5/pgxpool"

var _ *pgxpool.Pool
