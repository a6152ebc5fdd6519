package api

import (
	"strconv"
	"strings"

	ratelimitv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

// dynamicMetadata returns the dynamic metadata of a response, as
// envoyproxy/ratelimit writes it with RESPONSE_DYNAMIC_METADATA (Envoy's
// rate limit filter emits it under its own name,
// envoy.filters.http.ratelimit):
//
//	domain:      the request's domain
//	descriptors: for each descriptor, entries (a list of "key=value"),
//	             limit (its inline limit, as text) and hitsAddend (its
//	             own), each when it has one
//	hitsAddend:  the request's hits_addend, when not 0
//	metadata:    the metadata of the limits file's rules of the
//	             descriptors answered OK, merged in descriptor order: a
//	             field already set keeps its value, except that two
//	             mappings merge, field by field; absent when empty
//
// The rules' metadata is copied, never shared with the response.
func dynamicMetadata(req *rlsv3.RateLimitRequest, descs []envoyDescriptor, statuses []*rlsv3.RateLimitResponse_DescriptorStatus) *structpb.Struct {
	fields := map[string]*structpb.Value{"domain": structpb.NewStringValue(req.Domain)}
	list := make([]*structpb.Value, len(req.Descriptors))
	for i, pd := range req.Descriptors {
		list[i] = structpb.NewStructValue(descriptorMetadata(pd))
	}
	fields["descriptors"] = structpb.NewListValue(&structpb.ListValue{Values: list})
	if h := req.HitsAddend; h != 0 {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h))
	}
	var merged *structpb.Struct
	for i := range descs {
		d := &descs[i]
		if d.meta == nil || statuses[i].Code != rlsv3.RateLimitResponse_OK {
			continue
		}
		if merged == nil {
			merged = &structpb.Struct{Fields: make(map[string]*structpb.Value, len(d.meta.Fields))}
		}
		mergeMetadata(merged, d.meta)
	}
	if len(merged.GetFields()) > 0 {
		fields["metadata"] = structpb.NewStructValue(merged)
	}
	return &structpb.Struct{Fields: fields}
}

// descriptorMetadata describes one descriptor of the request.
func descriptorMetadata(pd *ratelimitv3.RateLimitDescriptor) *structpb.Struct {
	entries := make([]*structpb.Value, len(pd.GetEntries()))
	for i, e := range pd.GetEntries() {
		entries[i] = structpb.NewStringValue(e.GetKey() + "=" + e.GetValue())
	}
	fields := map[string]*structpb.Value{"entries": structpb.NewListValue(&structpb.ListValue{Values: entries})}
	if l := pd.GetLimit(); l != nil {
		fields["limit"] = structpb.NewStringValue(limitText(l))
	}
	if h := pd.GetHitsAddend(); h != nil {
		fields["hitsAddend"] = structpb.NewNumberValue(float64(h.GetValue()))
	}
	return &structpb.Struct{Fields: fields}
}

// limitText writes an inline limit in protobuf's text format, as
// envoyproxy/ratelimit does, but always with the same spacing (protobuf's
// own String varies it on purpose): "requests_per_unit:10 unit:MINUTE".
func limitText(l *ratelimitv3.RateLimitDescriptor_RateLimitOverride) string {
	var b strings.Builder
	b.WriteString("requests_per_unit:")
	b.WriteString(strconv.FormatUint(uint64(l.GetRequestsPerUnit()), 10))
	b.WriteString(" unit:")
	b.WriteString(l.GetUnit().String())
	if m := l.GetUnitMultiplier(); m != nil {
		b.WriteString(" unit_multiplier:{value:")
		b.WriteString(strconv.FormatUint(uint64(m.GetValue()), 10))
		b.WriteString("}")
	}
	return b.String()
}

// mergeMetadata merges src into dst, which the caller owns: a field dst
// lacks is copied from src; two mappings merge recursively; any other
// field of dst keeps its value. src is not modified, nor shared.
func mergeMetadata(dst, src *structpb.Struct) {
	for k, v := range src.GetFields() {
		have, ok := dst.Fields[k]
		if !ok {
			dst.Fields[k] = proto.Clone(v).(*structpb.Value)
			continue
		}
		if hs, ss := have.GetStructValue(), v.GetStructValue(); hs != nil && ss != nil {
			if hs.Fields == nil {
				hs.Fields = make(map[string]*structpb.Value)
			}
			mergeMetadata(hs, ss)
		}
	}
}
