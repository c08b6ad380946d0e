package relay

import (
	"context"

	"github.com/jackc/pgx/v5"
)

// ClaimSession opens a claim session as the relay's publish loop does.
func (r *Relay) ClaimSession(ctx context.Context) (*pgx.Conn, int32, error) { return r.connect(ctx) }
