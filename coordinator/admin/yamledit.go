package admin

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"go.yaml.in/yaml/v3"
)

// setLimitField returns src with field of the limit called limit set to
// value (a YAML scalar with tag, "!!bool" or "!!str"), and the domain the
// limit is in. domain may be empty when one domain only has such a limit.
// Nested limits are found too; Envoy-format documents are not searched.
// The rest of the file, comments included, is kept; the encoder may
// re-indent it.
func setLimitField(src []byte, domain, limit, field, value, tag string) ([]byte, string, error) {
	var docs []*yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(src))
	for {
		var doc yaml.Node
		if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, "", fmt.Errorf("%w: the current configuration: %v", ErrBadRequest, err)
		}
		docs = append(docs, &doc)
	}
	type hit struct {
		domain string
		node   *yaml.Node
	}
	var hits []hit
	for _, doc := range docs {
		if len(doc.Content) == 0 {
			continue
		}
		root := doc.Content[0]
		name := scalar(get(root, "domain"))
		if domain != "" && name != domain {
			continue
		}
		for _, n := range findLimits(get(root, "limits"), limit) {
			hits = append(hits, hit{name, n})
		}
	}
	switch {
	case len(hits) == 0 && domain != "":
		return nil, "", fmt.Errorf("%w: no limit %q in domain %q", ErrNotFound, limit, domain)
	case len(hits) == 0:
		return nil, "", fmt.Errorf("%w: no limit %q in any domain", ErrNotFound, limit)
	case len(hits) > 1:
		var ds []string
		for _, h := range hits {
			ds = append(ds, h.domain)
		}
		return nil, "", fmt.Errorf("%w: limit %q is in domains %s: name one with --domain", ErrBadRequest, limit, strings.Join(ds, ", "))
	}
	m := hits[0].node
	if v := get(m, field); v != nil {
		*v = yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value, LineComment: v.LineComment}
	} else {
		m.Content = append(m.Content,
			&yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: field},
			&yaml.Node{Kind: yaml.ScalarNode, Tag: tag, Value: value})
	}
	var out bytes.Buffer
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	for _, doc := range docs {
		if err := enc.Encode(doc); err != nil {
			return nil, "", fmt.Errorf("encode the configuration: %w", err)
		}
	}
	if err := enc.Close(); err != nil {
		return nil, "", fmt.Errorf("encode the configuration: %w", err)
	}
	return out.Bytes(), hits[0].domain, nil
}

// findLimits returns the limit mappings called name in a list of limits
// and in their nested lists.
func findLimits(list *yaml.Node, name string) []*yaml.Node {
	if list == nil || list.Kind != yaml.SequenceNode {
		return nil
	}
	var out []*yaml.Node
	for _, l := range list.Content {
		if l.Kind != yaml.MappingNode {
			continue
		}
		if scalar(get(l, "name")) == name {
			out = append(out, l)
		}
		out = append(out, findLimits(get(l, "limits"), name)...)
	}
	return out
}

// get returns the value of key in mapping m, or nil.
func get(m *yaml.Node, key string) *yaml.Node {
	if m == nil || m.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			return m.Content[i+1]
		}
	}
	return nil
}

func scalar(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode {
		return ""
	}
	return n.Value
}
