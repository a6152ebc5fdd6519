package cluster

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// meta is what a node gossips about itself in memberlist's node metadata
// (at most 512 bytes). It is JSON so that later versions can add fields
// that earlier ones ignore.
type meta struct {
	// GRPC is the node's gRPC address for forwarded checks.
	GRPC string `json:"grpc"`
	// Started is the Unix time in nanoseconds at which the process started
	// its membership.
	Started int64 `json:"started"`
	// Leaving is set once the node announced it is about to leave.
	Leaving bool `json:"leaving,omitempty"`
	// Left is set once the node handed every key over, just before it
	// leaves: peers then drop it from the roster.
	Left bool `json:"left,omitempty"`
	// Inc is the node's incarnation (see RosterEntry.Incarnation).
	Inc uint64 `json:"inc,omitempty"`
}

// phase is the roster phase the metadata announces.
func (m meta) phase() Phase {
	switch {
	case m.Left:
		return PhaseLeft
	case m.Leaving:
		return PhaseLeaving
	}
	return PhaseJoined
}

var errNoGRPC = errors.New("no gRPC address")

func (m meta) encode() []byte {
	b, err := json.Marshal(m)
	if err != nil {
		panic(fmt.Sprintf("cluster: encode node meta: %v", err)) // strings, numbers and booleans
	}
	return b
}

func decodeMeta(b []byte) (meta, error) {
	var m meta
	if err := json.Unmarshal(b, &m); err != nil {
		return meta{}, err
	}
	if m.GRPC == "" {
		return meta{}, errNoGRPC
	}
	return m, nil
}

func (m meta) started() time.Time { return time.Unix(0, m.Started) }
