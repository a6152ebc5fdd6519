package api

import (
	"github.com/sluice-io/sluice/api/overrides"
	"github.com/sluice-io/sluice/cluster"
	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// What the web UI (package ui) asks of a node in-process, besides Traffic
// and KeyOwner. Its calls do not pass the gRPC interceptors: the UI checks
// the admin token itself.

// NodeName is the node's name.
func (s *Server) NodeName() string { return s.cfg.NodeName }

// Admin returns the admin service, answering as it does over gRPC (for the
// whole cluster).
func (s *Server) Admin() sluicepb.AdminServiceServer { return &adminService{s: s} }

// KeyStandby names the node that holds a copy of key's state, "" when
// there is none (a single node, or keys without standbys).
func (s *Server) KeyStandby(key string) string {
	return s.cluster.Standby(key)
}

// OverrideFor returns the override that applies to key's checks now, nil
// when none does.
func (s *Server) OverrideFor(key []byte) *sluicepb.Override {
	if o := s.overrides.Match(string(key), s.clock.Now()); o != nil {
		return overrides.ToProto(o)
	}
	return nil
}

// MembershipChanges returns the last changes of the live members this node
// saw, oldest first; none for a single node.
func (s *Server) MembershipChanges() []cluster.Change {
	return s.cluster.Changes()
}
