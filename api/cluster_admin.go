package api

import (
	"context"
	"slices"
	"strings"

	sluicepb "github.com/sluice-io/sluice/proto/sluice/v1"
)

// In a cluster, admin calls are answered as if there were one node (see
// cluster.AdminPeers, which reaches the other members): a key's state
// comes from its owner, listings cover every node, and overrides are set
// on every node (overrides.Table.Replicate).

// listKeysCluster merges one page of keys from every member.
func (s *Server) listKeysCluster(ctx context.Context, req *sluicepb.ListKeysRequest, local *sluicepb.ListKeysResponse, size int) (*sluicepb.ListKeysResponse, error) {
	all := slices.Clone(local.Keys)
	more := local.NextPageToken != ""
	for _, name := range s.peers.Others(ctx) {
		client, err := s.peers.Client(name)
		if err != nil {
			return nil, err
		}
		resp, err := client.ListKeys(s.peers.Context(ctx), req)
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
