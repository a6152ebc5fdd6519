package api

import (
	"context"
	"errors"
	"slices"
	"strings"

	"google.golang.org/grpc/metadata"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// In a cluster, admin calls are answered as if there were one node: a key's
// state comes from its owner, listings cover every node, and overrides are
// set on every node. The node that receives a call does the fan-out; the
// calls it makes carry replicatedHeader so that they are answered locally.
const replicatedHeader = "x-sluice-replicated"

// replicated reports whether ctx is an admin call made by another node.
func replicated(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	return len(md.Get(replicatedHeader)) > 0
}

// peerContext is ctx for an admin call to another node: the admin token and
// the replicated mark.
func (s *Server) peerContext(ctx context.Context) context.Context {
	kv := []string{replicatedHeader, s.cfg.NodeName}
	if s.cfg.AdminToken != "" {
		kv = append(kv, "authorization", "Bearer "+s.cfg.AdminToken)
	}
	return metadata.NewOutgoingContext(ctx, metadata.Pairs(kv...))
}

// peerAdmin returns an admin client for the member named name.
func (s *Server) peerAdmin(name string) (sluicepb.AdminServiceClient, error) {
	conn, err := s.router().AdminConn(name)
	if err != nil {
		return nil, err
	}
	return sluicepb.NewAdminServiceClient(conn), nil
}

// keyOwner returns an admin client for key's owner when that is another
// node and the call did not come from one; nil means answer locally.
func (s *Server) keyOwner(ctx context.Context, key []byte) (sluicepb.AdminServiceClient, error) {
	if err := s.joining(); err != nil {
		return nil, err
	}
	r := s.router()
	if r == nil || replicated(ctx) {
		return nil, nil
	}
	owner, remote := r.Owner(string(key))
	if !remote {
		return nil, nil
	}
	return s.peerAdmin(owner)
}

// others returns the names of the other live members; none for a single
// node or a call that came from another node.
func (s *Server) otherMembers(ctx context.Context) []string {
	m := s.membership()
	if m == nil || replicated(ctx) {
		return nil
	}
	var names []string
	for _, m := range m.View().Members {
		if m.Name != s.cfg.NodeName {
			names = append(names, m.Name)
		}
	}
	return names
}

// replicateOverride applies an override change on every other member. A
// member that cannot be reached is logged; it gets the overrides when it
// next joins (syncOverrides).
func (s *Server) replicateOverride(ctx context.Context, call func(context.Context, sluicepb.AdminServiceClient) error) error {
	var errs []error
	for _, name := range s.otherMembers(ctx) {
		client, err := s.peerAdmin(name)
		if err == nil {
			err = call(s.peerContext(ctx), client)
		}
		if err != nil {
			s.log.Warn("admin: replicate override", "to", name, "err", err)
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// listKeysCluster merges one page of keys from every member.
func (s *Server) listKeysCluster(ctx context.Context, req *sluicepb.ListKeysRequest, local *sluicepb.ListKeysResponse, size int) (*sluicepb.ListKeysResponse, error) {
	all := slices.Clone(local.Keys)
	more := local.NextPageToken != ""
	for _, name := range s.otherMembers(ctx) {
		client, err := s.peerAdmin(name)
		if err != nil {
			return nil, err
		}
		resp, err := client.ListKeys(s.peerContext(ctx), req)
		if err != nil {
			return nil, err
		}
		all = append(all, resp.Keys...)
		more = more || resp.NextPageToken != ""
	}
	slices.SortFunc(all, func(a, b *sluicepb.KeySummary) int { return strings.Compare(string(a.Key), string(b.Key)) })
	all = slices.CompactFunc(all, func(a, b *sluicepb.KeySummary) bool { return string(a.Key) == string(b.Key) })
	out := &sluicepb.ListKeysResponse{Keys: all}
	if len(all) > size {
		out.Keys = all[:size]
		more = true
	}
	if more && len(out.Keys) > 0 {
		out.NextPageToken = encodeToken(string(out.Keys[len(out.Keys)-1].Key))
	}
	return out, nil
}

// syncOverrides copies the overrides of another member, so that a node
// that joins (or returns) applies the same overrides as the others.
func (s *Server) syncOverrides(ctx context.Context) {
	a := &adminService{s: s}
	for _, name := range s.otherMembers(ctx) {
		client, err := s.peerAdmin(name)
		if err != nil {
			continue
		}
		token := ""
		for {
			resp, err := client.ListOverrides(s.peerContext(ctx), &sluicepb.ListOverridesRequest{PageSize: 1000, PageToken: token})
			if err != nil {
				s.log.Warn("admin: copy overrides", "from", name, "err", err)
				break
			}
			for _, o := range resp.Overrides {
				o.SetAt = nil
				if _, err := a.SetOverride(metadata.NewIncomingContext(ctx, metadata.Pairs(replicatedHeader, name)), &sluicepb.SetOverrideRequest{Override: o}); err != nil {
					s.log.Warn("admin: copy override", "from", name, "err", err)
				}
			}
			if token = resp.NextPageToken; token == "" {
				return
			}
		}
	}
}
