package transform_test

import (
	"path/filepath"
	"testing"

	"github.com/loom-ml/loom/transform"
	"github.com/loom-ml/loom/transform/transformtest"
)

// TestGolden runs every registered transform on its testdata/<name>/*.txtar cases.
// go test ./transform -run Golden -update rewrites the expected outputs.
func TestGolden(t *testing.T) {
	for _, tr := range transform.All() {
		t.Run(tr.Name, func(t *testing.T) {
			transformtest.Run(t, filepath.Join("testdata", tr.Name), tr)
		})
	}
}
