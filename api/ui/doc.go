// Package ui serves the operator's web pages under /ui/ on a node's HTTP
// listener: the cluster (members, their traffic, membership changes), the
// keys decided and denied most, decisions, denials and errors over the
// last minutes, a key's live state with its sliding log drawn as a
// timeline (and the Envoy descriptor → key lookup), and the overrides.
//
// The pages are plain HTML, CSS and a small dependency-free script,
// embedded in the binary (static/), with no build step. The script reads
// JSON from /ui/api/ (this package's handlers), which the node answers for
// the whole cluster through the same code as the admin API: any node
// shows every node.
//
// # Access
//
// The pages are read-only. When the node has an admin token, every
// /ui/api/ request needs it as "Authorization: Bearer <token>", like the
// admin API; the script asks for it once per browser tab, keeps it in the
// tab's sessionStorage and sends it in that header, never in a URL, so it
// is in no address bar, history, referrer or access log. The static files
// hold no data and need no token. Responses carry a Content-Security-Policy
// that allows only the node's own script and styles.
//
// Handlers are safe for concurrent use; they keep no state of their own.
package ui
