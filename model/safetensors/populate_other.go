//go:build !linux

package safetensors

// populateRange does nothing where the kernel cannot populate a range: the pages are faulted
// in at the first read.
func populateRange([]byte) error { return nil }

// adviseHugePages does nothing where the kernel takes no huge-page advice for file mappings.
func adviseHugePages([]byte) {}
