package db_test

import (
	"bytes"
	"context"
	"net"
	"strings"
	"sync"
	"testing"
	"unsafe"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/quillhq/quill/internal/db"
	"github.com/quillhq/quill/internal/dbtest"
)

// writeLog is a connection that notes each write's length and where its
// bytes were.
type writeLog struct {
	net.Conn
	mu     sync.Mutex
	writes []written
}

type written struct {
	n    int
	addr unsafe.Pointer
}

func (w *writeLog) Write(p []byte) (int, error) {
	w.mu.Lock()
	w.writes = append(w.writes, written{len(p), unsafe.Pointer(unsafe.SliceData(p))})
	w.mu.Unlock()
	return w.Conn.Write(p)
}

func (w *writeLog) last() written {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.writes[len(w.writes)-1]
}

// A transaction sent whole goes in one write from the buffer the
// connection keeps for its trips when it is past pgproto3's 1 KiB and
// within 64 KiB, tripBytes bounds what is sent, and what comes back is
// what was sent — for trips of every size around those bounds, one after
// another and between statements pgx sends itself, when the frontend
// writes into that buffer too.
func TestDirectTripsReserveTheirBuffer(t *testing.T) {
	t.Parallel()
	cfg, err := pgx.ParseConfig(dbtest.URL())
	require.NoError(t, err)
	require.Equal(t, pgx.QueryExecModeCacheStatement, cfg.DefaultQueryExecMode)
	log := &writeLog{}
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		log.Conn = c
		return log, nil
	}
	ctx := t.Context()
	c, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	defer c.Close(context.Background())

	sizes := []int{0, 100}
	for n := 800; n <= 1200; n += 16 {
		sizes = append(sizes, n)
	}
	sizes = append(sizes, 3000, 20000, 60000, 70000, 300000, 2000)
	for round := range 2 {
		for _, n := range sizes {
			text := strings.Repeat("q", n)
			bin := bytes.Repeat([]byte{7}, n/3)
			var gotText string
			var gotBin []byte
			var gotSum int64
			b := &pgx.Batch{}
			b.Queue(`SELECT $1::text`, text).QueryRow(func(r pgx.Row) error { return r.Scan(&gotText) })
			b.Queue(`SELECT $1::bytea, $2::int8 + $3::int8`, bin, int64(n), int64(round)).QueryRow(func(r pgx.Row) error { return r.Scan(&gotBin, &gotSum) })
			b.Queue(`SELECT 1`)
			bound, wbuf, err := db.SendDirect(ctx, c, b)
			require.NoError(t, err, "round %d, %d bytes", round, n)
			require.Equal(t, text, gotText, "round %d, %d bytes", round, n)
			require.Equal(t, bin, gotBin, "round %d, %d bytes", round, n)
			require.Equal(t, int64(n+round), gotSum, "round %d, %d bytes", round, n)
			w := log.last()
			require.LessOrEqual(t, w.n, bound, "round %d, %d bytes: the trip past its bound", round, n)
			if bound > 1<<10 && bound <= 64<<10 {
				require.NotZero(t, cap(wbuf), "round %d, %d bytes: no buffer kept", round, n)
				require.Equal(t, unsafe.Pointer(unsafe.SliceData(wbuf[:1])), w.addr,
					"round %d, %d bytes (%d sent, bound %d): not sent from the kept buffer", round, n, w.n, bound)
			}
			// pgx's own path, through the frontend's buffer (which may
			// be the kept one), between two trips.
			var echo string
			require.NoError(t, c.QueryRow(ctx, `SELECT $1::text`, text[:min(n, 500)]).Scan(&echo))
			require.Equal(t, text[:min(n, 500)], echo)
		}
	}
}
