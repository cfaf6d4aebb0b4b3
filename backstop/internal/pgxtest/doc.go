// Package pgxtest holds tests of packages backstop and pgstore through
// pgx's database/sql driver (github.com/jackc/pgx/v5/stdlib). It is a
// module of its own so that pgx, which only these tests need, stays out of
// the root module's go.mod. It has no code besides its tests.
package pgxtest
