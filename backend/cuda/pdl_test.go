package cuda

import (
	"fmt"
	"regexp"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/loom-ml/loom/cubind"
	"github.com/loom-ml/loom/internal/gputest"
	"github.com/loom-ml/loom/tensor"
)

// A kernel launched with programmatic dependent launch may start while the kernel before it
// on the stream still runs: it must not touch memory that another kernel writes or reads
// until griddepcontrol.wait (pdl_wait, pdl_begin in common.cuh) has returned. The tests here
// check that rule on the code NVRTC generates (TestPDLKernelsWait) and, where there is no
// NVRTC, on the sources (TestPDLFilesWait).

// pdlInstances are the instantiations TestPDLKernelsWait compiles for the template-only
// kernels of pdlFiles (the files' own instantiations come with the file): at least one use
// of every macro that defines a kernel, in the forms the backend launches.
func pdlInstances() map[string][]string {
	flash1, _ := flashKernel(64, 1)
	flash2, _ := flashKernel(128, 2)
	var paged []string
	for _, c := range []pagedCase{
		{ctx: []int{5}, nw: []int{1}, bs: 16, KV: 8, G: 4, D: 128, dt: tensor.BF16, cdt: tensor.BF16},   // decode
		{ctx: []int{900}, nw: []int{1}, bs: 16, KV: 2, G: 4, D: 128, dt: tensor.BF16, cdt: tensor.BF16}, // decode in splits
		{ctx: []int{5}, nw: []int{9}, bs: 16, KV: 2, G: 1, D: 40, dt: tensor.F32, cdt: tensor.BF16},     // prefill
	} {
		for _, k := range c.kernels() {
			if !slices.Contains(paged, k) {
				paged = append(paged, k)
			}
		}
	}
	paged = append(paged, "GATHER(unsigned short, b2)", "GATHER(unsigned long long, b8)")
	return map[string][]string{
		"flash.cu": {flash1, flash2},
		"gemv.cu": {
			"GEMV(g1, 1, 8, 8, BF16)", "GEMV(g4, 4, 4, 4, F32)",
			"GEMV_SWIGLU(s1, 1, 4, 4, BF16)", "GEMV_QKV_ROPE(q1, 2, 4, 4, BF16, int)", "GEMV_QKV_ROPE(q2, 1, 2, 4, F32, i64)",
		},
		"norm.cu": {
			"RMSNORM_VEC(BF16, bf16, BF16, bf16, 8, 1)", "RMSNORM_VEC(F32, f32, BF16, bf16, 1, 32)",
			"ADD_RMSNORM_VEC(BF16, bf16, BF16, bf16, F32, f32, 8, 4)", "ADD_RMSNORM_VEC(F32, f32, BF16, bf16, BF16, bf16, 4, 8)",
		},
		"paged.cu": paged,
		"fp8.cu": {
			"DEQUANT_FP8(dq1, true, BF16, F32)", "FP8_GEMV(fg1, 1, 2, 4, BF16, true, F32, false)",
			"FP8_GEMV(fg2, 2, 4, 2, F32, false, BF16, true)", "FP8_GEMV_GENERIC(fgg, 3, BF16, true, Half16)",
		},
		"moe.cu": {moeInstances[0], moeInstances[1]},
	}
}

// kernelMacro matches the name of a macro whose definition holds a kernel.
var kernelMacro = regexp.MustCompile(`(?m)^#define\s+(\w+)\(((?:[^\n]*\\\n)*[^\n]*)`)

// TestPDLKernelsWait compiles every file of pdlFiles to PTX for sm_90 (NVRTC, no GPU) with
// its instantiations, and follows every path through each kernel: no path may reach an
// access to global or generic memory (a load, store, atomic, asynchronous copy, or a call)
// before it has passed an unconditional griddepcontrol.wait. The one exception is the
// weight stream of gemv.cu (gemv_load_w): loads marked ld.global.nc.L1::no_allocate read
// weights, which no kernel writes, and may start while the previous kernel finishes.
func TestPDLKernelsWait(t *testing.T) {
	if testing.Short() {
		t.Skip("compiling takes seconds; skipped with -short")
	}
	_, err := cubind.NVRTCLibrary()
	gputest.Missing(t, "NVRTC", err)
	if archs, _ := cubind.NVRTCSupportedArchs(); archs != nil && !slices.Contains(archs, 90) {
		gputest.Missing(t, "NVRTC that targets sm_90", fmt.Errorf("NVRTC compiles for %v", archs))
	}
	insts := pdlInstances()
	var files []string
	for f := range pdlFiles {
		files = append(files, f)
	}
	sort.Strings(files)
	var wg sync.WaitGroup
	for _, file := range files {
		extra := strings.Join(insts[file], "\n")
		src, err := kernelSource(file, extra)
		if err != nil {
			t.Fatal(err)
		}
		// Every macro that defines a kernel is used, by the file or by pdlInstances.
		body, _ := kernelFS.ReadFile("kernels/" + file)
		for _, m := range kernelMacro.FindAllStringSubmatch(string(body), -1) {
			if strings.Contains(m[2], "__global__") && strings.Count(string(body)+"\n"+extra, m[1]+"(") < 2 {
				t.Errorf("%s: no instantiation of %s: add one to pdlInstances", file, m[1])
			}
		}
		wg.Go(func() {
			ptx, _, err := cubind.CompilePTX(src, file, append([]string{"--gpu-architecture=compute_90"}, kernelOptions(file)...))
			if err != nil {
				t.Errorf("%s: %v", file, err)
				return
			}
			kernels, err := parsePTX(ptx)
			if err != nil {
				t.Errorf("%s: %v", file, err)
				return
			}
			if len(kernels) == 0 {
				t.Errorf("%s: no kernel in the PTX", file)
			}
			for _, k := range kernels {
				early, err := k.beforeWait()
				if err != nil {
					t.Errorf("%s: kernel %s: %v", file, k.name, err)
				}
				if len(early) > 0 {
					t.Errorf("%s: kernel %s may run %q (PTX line %d) before griddepcontrol.wait, and %d more accesses",
						file, k.name, early[0].text, early[0].line, len(early)-1)
				}
			}
			t.Logf("%s: %d kernels checked", file, len(kernels))
		})
	}
	wg.Wait()
}

// ptxInst is one instruction of a kernel.
type ptxInst struct {
	guarded bool   // under a predicate (@%p or @!%p)
	op      string // the opcode with its modifiers, such as ld.global.nc.v4.u32
	args    string
	text    string
	line    int
}

// ptxKernel is one .entry of a PTX module.
type ptxKernel struct {
	name   string
	insts  []ptxInst
	labels map[string]int // the index of the instruction each label marks
}

// parsePTX returns the kernels (.entry functions) of a PTX module.
func parsePTX(ptx string) ([]ptxKernel, error) {
	var (
		out   []ptxKernel
		k     *ptxKernel
		depth int
	)
	for n, line := range strings.Split(ptx, "\n") {
		if i := strings.Index(line, "//"); i >= 0 {
			line = line[:i]
		}
		line = strings.TrimSpace(line)
		if k == nil {
			if _, rest, ok := strings.Cut(line, ".entry "); ok && !strings.HasPrefix(line, "//") {
				name, _, _ := strings.Cut(rest, "(")
				out = append(out, ptxKernel{name: strings.TrimSpace(name), labels: map[string]int{}})
				k, depth = &out[len(out)-1], 0
			}
			continue
		}
		switch {
		case line == "{":
			depth++
			continue
		case line == "}":
			if depth--; depth == 0 {
				k = nil
			}
			continue
		case depth == 0 || line == "":
			continue // the parameters and directives before the body
		case strings.HasSuffix(line, ":") && !strings.ContainsAny(line, " \t;"):
			k.labels[strings.TrimSuffix(line, ":")] = len(k.insts)
			continue
		}
		for _, st := range strings.Split(line, ";") {
			st = strings.TrimSpace(strings.Trim(strings.TrimSpace(st), "{}"))
			if st == "" || strings.HasPrefix(st, ".") {
				continue // declarations (.reg, .shared, .local) and .pragma
			}
			in := ptxInst{text: st, line: n + 1}
			if strings.HasPrefix(st, "@") {
				_, st, _ = strings.Cut(st, " ")
				in.guarded = true
				st = strings.TrimSpace(st)
			}
			in.op, in.args, _ = strings.Cut(st, " ")
			in.args = strings.TrimSpace(in.args)
			k.insts = append(k.insts, in)
		}
	}
	if k != nil {
		return nil, fmt.Errorf("kernel %s has no end", k.name)
	}
	return out, nil
}

// successors returns the instructions that may run after instruction i.
func (k *ptxKernel) successors(i int) ([]int, error) {
	in := k.insts[i]
	root, _, _ := strings.Cut(in.op, ".")
	var next []int
	fall := i+1 < len(k.insts)
	switch root {
	case "bra":
		target, ok := k.labels[strings.TrimSpace(in.args)]
		if !ok {
			return nil, fmt.Errorf("%q (PTX line %d): unknown label", in.text, in.line)
		}
		next = append(next, target)
		fall = fall && in.guarded
	case "ret", "exit", "trap":
		fall = fall && in.guarded
	case "brx":
		return nil, fmt.Errorf("%q (PTX line %d): indirect branches are not followed", in.text, in.line)
	}
	if fall {
		next = append(next, i+1)
	}
	return next, nil
}

// beforeWait returns the memory accesses that some path through the kernel reaches before
// an unconditional griddepcontrol.wait.
func (k *ptxKernel) beforeWait() ([]ptxInst, error) {
	n := len(k.insts)
	if n == 0 {
		return nil, nil
	}
	// waited[i]: every path to instruction i has passed a wait (the greatest fixed point).
	waited := make([]bool, n)
	for i := 1; i < n; i++ {
		waited[i] = true
	}
	succ := make([][]int, n)
	for i := range n {
		s, err := k.successors(i)
		if err != nil {
			return nil, err
		}
		succ[i] = s
	}
	for changed := true; changed; {
		changed = false
		for i := range n {
			out := waited[i] || (k.insts[i].op == "griddepcontrol.wait" && !k.insts[i].guarded)
			for _, s := range succ[i] {
				if waited[s] && !out {
					waited[s], changed = false, true
				}
			}
		}
	}
	var early []ptxInst
	for i, in := range k.insts {
		if !waited[i] && sharedMemoryAccess(in.op) {
			early = append(early, in)
		}
	}
	return early, nil
}

// sharedMemoryAccess reports whether an instruction may touch memory that other kernels
// use: global or generic (or constant) addresses, and calls, whose bodies are not followed.
// Parameters, shared and local memory belong to the kernel; so do the weights streamed
// with ld.global.nc.L1::no_allocate (see TestPDLKernelsWait).
func sharedMemoryAccess(op string) bool {
	parts := strings.Split(op, ".")
	global := slices.Contains(parts, "global")
	switch parts[0] {
	case "call":
		return true
	case "cp": // asynchronous copies name both spaces; commit and wait name none
		return global
	case "ld", "ldu", "st", "atom", "red", "multimem", "tex", "tld4", "suld", "sust", "sured":
	default:
		return false
	}
	if global {
		return !(parts[0] == "ld" && slices.Contains(parts, "nc") && slices.Contains(parts, "L1::no_allocate"))
	}
	for _, p := range parts[1:] {
		if p == "param" || p == "local" || strings.HasPrefix(p, "shared") {
			return false
		}
	}
	return true // generic or constant addresses
}

// The PTX check itself: what counts as an access, and which paths reach one before the wait.
func TestPTXBeforeWait(t *testing.T) {
	for _, tc := range []struct {
		name, body string
		early      []string // the accesses found before the wait
	}{
		{"wait first", `
	ld.param.u64 	%rd1, [k_param_0];
	griddepcontrol.wait;
	ld.global.f32 	%f1, [%rd1];
	st.global.f32 	[%rd1], %f1;
	ret;`, nil},
		{"load before the wait", `
	ld.param.u64 	%rd1, [k_param_0];
	ld.global.f32 	%f1, [%rd1];
	griddepcontrol.wait;
	st.global.f32 	[%rd1], %f1;
	ret;`, []string{"ld.global.f32 	%f1, [%rd1]"}},
		{"generic store, atomic and call before the wait", `
	st.u32 	[%rd1], %r1;
	atom.global.add.u32 	%r2, [%rd1], 1;
	call.uni (retval0), f, (param0);
	griddepcontrol.wait;
	ret;`, []string{"st.u32 	[%rd1], %r1", "atom.global.add.u32 	%r2, [%rd1], 1", "call.uni (retval0), f, (param0)"}},
		{"shared, local and the weight stream before the wait", `
	st.shared.u32 	[%r1], %r2;
	ld.local.u32 	%r3, [%rd2];
	ld.global.nc.L1::no_allocate.v4.u32 {%r4,%r5,%r6,%r7}, [%rd3];
	cp.async.wait_all;
	griddepcontrol.wait;
	ld.global.nc.f32 	%f1, [%rd1];
	ret;`, nil},
		{"a branch around the wait", `
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
	griddepcontrol.wait;
$L__BB0_2:
	ld.global.f32 	%f1, [%rd1];
	ret;`, []string{"ld.global.f32 	%f1, [%rd1]"}},
		{"an early exit before the wait", `
	setp.eq.s32 	%p1, %r1, 0;
	@%p1 bra 	$L__BB0_2;
	griddepcontrol.wait;
	ld.global.f32 	%f1, [%rd1];
$L__BB0_2:
	ret;`, nil},
		{"a conditional wait", `
	@%p1 griddepcontrol.wait;
	ld.global.f32 	%f1, [%rd1];
	ret;`, []string{"ld.global.f32 	%f1, [%rd1]"}},
		{"a loop whose first pass precedes the wait", `
$L__BB0_1:
	ld.global.f32 	%f1, [%rd1];
	griddepcontrol.wait;
	@%p1 bra 	$L__BB0_1;
	ret;`, []string{"ld.global.f32 	%f1, [%rd1]"}},
		{"an inline asm block on its own lines", `
	{
	.reg .pred p;
	griddepcontrol.wait;
	}
	ld.global.f32 	%f1, [%rd1];
	ret;`, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ptx := ".version 7.8\n.target sm_90\n\n.visible .entry k(\n\t.param .u64 k_param_0\n)\n{\n\t.reg .b32 %r<9>;\n" + tc.body + "\n}\n"
			ks, err := parsePTX(ptx)
			if err != nil || len(ks) != 1 || ks[0].name != "k" {
				t.Fatalf("parsePTX: %d kernels, %v", len(ks), err)
			}
			early, err := ks[0].beforeWait()
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, in := range early {
				got = append(got, in.text)
			}
			if !slices.Equal(got, tc.early) {
				t.Errorf("before the wait: %q, want %q", got, tc.early)
			}
		})
	}
}

// braceBody returns the text between the brace at src[open] and its match.
func braceBody(src string, open int) string {
	depth := 0
	for i := open; i < len(src); i++ {
		switch src[i] {
		case '{':
			depth++
		case '}':
			depth--
			if depth == 0 {
				return src[open+1 : i]
			}
		}
	}
	return src[open+1:]
}

// waitsThrough reports whether body waits itself or in an _impl function it calls, directly
// or through other _impl functions.
func waitsThrough(body string, impls map[string]string, seen map[string]bool) bool {
	if waitCall.MatchString(body) {
		return true
	}
	for _, c := range implCall.FindAllStringSubmatch(body, -1) {
		if !seen[c[1]] {
			seen[c[1]] = true
			if waitsThrough(impls[c[1]], impls, seen) {
				return true
			}
		}
	}
	return false
}

var (
	implDef  = regexp.MustCompile(`void\s+(\w+_impl)\s*\(`)
	implCall = regexp.MustCompile(`\b(\w+_impl)\s*[<(]`)
	waitCall = regexp.MustCompile(`\bpdl_(wait|begin)\s*\(\s*\)\s*;`)
	comment  = regexp.MustCompile(`(?s)//[^\n]*|/\*.*?\*/`)
)

// TestPDLFilesWait is the check of the sources, for machines without NVRTC: every kernel of
// a file of pdlFiles calls pdl_wait or pdl_begin itself or in the _impl functions it calls
// (comments do not count). Where the call sits, and whether every path passes it, only
// TestPDLKernelsWait can tell.
func TestPDLFilesWait(t *testing.T) {
	for file := range pdlFiles {
		b, err := kernelFS.ReadFile("kernels/" + file)
		if err != nil {
			t.Fatalf("pdlFiles lists %s: %v", file, err)
		}
		src := comment.ReplaceAllString(string(b), "")
		impls := map[string]string{}
		for _, m := range implDef.FindAllStringSubmatchIndex(src, -1) {
			if open := strings.IndexByte(src[m[1]:], '{'); open >= 0 {
				impls[src[m[2]:m[3]]] = braceBody(src, m[1]+open)
			}
		}
		kernels := 0
		for rest, off := src, 0; ; {
			i := strings.Index(rest, "__global__")
			if i < 0 {
				break
			}
			at := off + i
			open := strings.IndexByte(src[at:], '{')
			if open < 0 {
				t.Fatalf("%s: a __global__ without a body", file)
			}
			header := src[at : at+open]
			if !waitsThrough(braceBody(src, at+open), impls, map[string]bool{}) {
				t.Errorf("%s: kernel %q neither waits (pdl_wait/pdl_begin) nor calls an _impl that does", file, strings.TrimSpace(header))
			}
			kernels++
			off = at + open + 1
			rest = src[off:]
		}
		if kernels == 0 {
			t.Errorf("%s: no kernels found", file)
		}
	}
}
