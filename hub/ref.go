package hub

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strings"
)

// DefaultRevision is the revision of a name that gives none.
const DefaultRevision = "main"

// Ref names a model repository of the Hub at one revision.
type Ref struct {
	Repo     string // ORG/NAME
	Revision string // a branch, a tag or a 40-hex commit; DefaultRevision when the name gives none
}

func (r Ref) String() string {
	if r.Revision == "" || r.Revision == DefaultRevision {
		return r.Repo
	}
	return r.Repo + "@" + r.Revision
}

// namePart is one half of ORG/NAME as the Hub accepts it (huggingface_hub's validate_repo_id):
// letters, digits, '_', '-' and '.', beginning and ending with a letter, a digit or '_'.
var namePart = regexp.MustCompile(`^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$`)

// commitHash is a full git commit id, as the Hub writes them.
var commitHash = regexp.MustCompile(`^[0-9a-f]{40}$`)

// IsCommit reports whether rev is a full commit hash (40 lowercase hex digits).
func IsCommit(rev string) bool { return commitHash.MatchString(rev) }

// ParseRef parses ORG/NAME[@REVISION]. The name must have exactly one '/', and each half the
// characters the Hub allows; a revision may hold '/' (refs/pr/1) but no '..' or '\'.
func ParseRef(s string) (Ref, error) {
	repo, rev, hasRev := strings.Cut(s, "@")
	if hasRev && rev == "" {
		return Ref{}, fmt.Errorf("model %q: empty revision after '@'", s)
	}
	if !hasRev {
		rev = DefaultRevision
	}
	if err := checkRepo(repo); err != nil {
		return Ref{}, fmt.Errorf("model %q: %w", s, err)
	}
	if !filepath.IsLocal(rev) || strings.ContainsAny(rev, "\\:\x00") || strings.Contains(rev, "..") ||
		strings.ContainsFunc(rev, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return Ref{}, fmt.Errorf("model %q: invalid revision %q", s, rev)
	}
	return Ref{Repo: repo, Revision: rev}, nil
}

func checkRepo(repo string) error {
	org, name, ok := strings.Cut(repo, "/")
	if !ok || strings.Contains(name, "/") {
		return fmt.Errorf("want ORG/NAME, one '/'")
	}
	if len(repo) > 96 {
		return fmt.Errorf("the name is longer than 96 characters")
	}
	for _, p := range []string{org, name} {
		if !namePart.MatchString(p) || strings.Contains(p, "--") || strings.Contains(p, "..") {
			return fmt.Errorf("%q is not a valid Hub name (letters, digits, '_', '-', '.'; no '--' or '..')", p)
		}
	}
	return nil
}

// RepoFolder is the cache folder name of a model repository: models--ORG--NAME.
func RepoFolder(repo string) string { return "models--" + strings.ReplaceAll(repo, "/", "--") }

// repoFromFolder is the inverse of RepoFolder; ok is false for a folder of another kind
// (datasets--, spaces--) or one that names no valid repository.
func repoFromFolder(folder string) (string, bool) {
	rest, ok := strings.CutPrefix(folder, "models--")
	if !ok {
		return "", false
	}
	parts := strings.Split(rest, "--")
	switch len(parts) {
	case 1: // a model without an organization (models--gpt2)
		return parts[0], namePart.MatchString(parts[0])
	case 2:
		repo := parts[0] + "/" + parts[1]
		return repo, checkRepo(repo) == nil
	}
	return "", false
}
