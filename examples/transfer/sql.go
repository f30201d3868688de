package main

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/fencelock/fencelock/examples/internal/demo"
)

// queries are the story's SQL statements, for one run's tables and the
// database's placeholders.
type queries struct {
	accounts, ledger string
	create           []string
	open             string // id, balance
	read             string // id
	write            string // balance, fence, id: unconditional, after the guard's Advance in the same transaction
	record           string // a ledger row
	all              string
	ledgerRows       string
}

func newQueries(db *demo.DB, accounts, ledger string) queries {
	return queries{
		accounts: accounts,
		ledger:   ledger,
		create: []string{
			`CREATE TABLE ` + accounts + ` (id TEXT PRIMARY KEY, balance_cents BIGINT NOT NULL, fence_token BIGINT NOT NULL)`,
			`CREATE TABLE ` + ledger + ` (transfer TEXT PRIMARY KEY, worker TEXT NOT NULL, from_id TEXT NOT NULL,
				to_id TEXT NOT NULL, amount_cents BIGINT NOT NULL, from_fence BIGINT NOT NULL, to_fence BIGINT NOT NULL)`,
		},
		open:  db.Rebind(`INSERT INTO ` + accounts + ` (id, balance_cents, fence_token) VALUES (?, ?, 0)`),
		read:  db.Rebind(`SELECT balance_cents FROM ` + accounts + ` WHERE id = ?`),
		write: db.Rebind(`UPDATE ` + accounts + ` SET balance_cents = ?, fence_token = ? WHERE id = ?`),
		record: db.Rebind(`INSERT INTO ` + ledger + ` (transfer, worker, from_id, to_id, amount_cents, from_fence, to_fence)
			VALUES (?, ?, ?, ?, ?, ?, ?)`),
		all:        `SELECT id, balance_cents, fence_token FROM ` + accounts + ` ORDER BY id`,
		ledgerRows: `SELECT transfer, worker, from_id, to_id, amount_cents, from_fence, to_fence FROM ` + ledger + ` ORDER BY transfer`,
	}
}

// balance reads an account's balance in tx.
func (q queries) balance(ctx context.Context, tx *sql.Tx, id string) (int64, error) {
	var cents int64
	if err := tx.QueryRowContext(ctx, q.read, id).Scan(&cents); err != nil {
		return 0, fmt.Errorf("read %s: %w", id, err)
	}
	return cents, nil
}

// balances returns every account.
func (q queries) balances(ctx context.Context, db *demo.DB) ([]Account, error) {
	rows, err := db.QueryContext(ctx, q.all)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Account
	for rows.Next() {
		var a Account
		if err := rows.Scan(&a.ID, &a.Balance, &a.Fence); err != nil {
			return nil, err
		}
		out = append(out, a)
	}
	return out, rows.Err()
}

// entries returns the ledger, by transfer.
func (q queries) entries(ctx context.Context, db *demo.DB) ([]Outcome, error) {
	rows, err := db.QueryContext(ctx, q.ledgerRows)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Outcome
	for rows.Next() {
		e := Outcome{Outcome: Moved}
		if err := rows.Scan(&e.ID, &e.Worker, &e.From, &e.To, &e.Amount, &e.FromFence, &e.ToFence); err != nil {
			return nil, err
		}
		out = append(out, e)
	}
	return out, rows.Err()
}
