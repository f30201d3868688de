package demo

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestRebind(t *testing.T) {
	tests := []struct {
		query, postgres string
	}{
		{"SELECT 1", "SELECT 1"},
		{"UPDATE t SET a = ?, b = ? WHERE c = ? AND d < ?", "UPDATE t SET a = $1, b = $2 WHERE c = $3 AND d < $4"},
		{"SELECT '?' , ? FROM \"odd?name\" WHERE x = ?", "SELECT '?' , $1 FROM \"odd?name\" WHERE x = $2"},
		{"SELECT 'it''s ?', ?", "SELECT 'it''s ?', $1"},
		{"INSERT INTO t VALUES (?,?,?,?,?,?,?,?,?,?)", "INSERT INTO t VALUES ($1,$2,$3,$4,$5,$6,$7,$8,$9,$10)"},
	}
	sqlite, pg := &DB{Driver: "sqlite"}, &DB{Driver: "pgx"}
	for _, tt := range tests {
		assert.Equal(t, tt.postgres, pg.Rebind(tt.query), "postgres: %s", tt.query)
		assert.Equal(t, tt.query, sqlite.Rebind(tt.query), "sqlite: %s", tt.query)
	}
}

func TestOpenDBRejects(t *testing.T) {
	for _, url := range []string{"mysql://x", "sqlite:///tmp/x.db", "postgres://%zz@x"} {
		_, err := OpenDB(t.Context(), url)
		assert.Error(t, err, url)
	}
}
