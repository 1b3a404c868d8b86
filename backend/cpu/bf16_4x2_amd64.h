// The bf16 4x2 micro-kernel's steps, shared by avx2BF16x4x2 (kernels_amd64.s) and
// avx2BF16Groups4x2 (kernels_groups_amd64.s), which must give the same bits. Registers:
// weight rows R8 and R9 (bf16), x rows SI, DX, R12 and R13 (float32), the element index AX;
// accumulators Y0-Y3 (x rows times w0) and Y4-Y7 (times w1); Y8-Y13 scratch. Only steps
// without labels live here: a macro expanded twice in one file cannot hold a label.

// BF16_4X2_ZERO clears the eight accumulators.
#define BF16_4X2_ZERO \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7

// BF16_4X2_K8 adds eight k, from element AX plus wo/2 (wo bytes into the weight rows, xo =
// 2*wo into the x rows): both weight rows widened exactly to f32, one fused multiply-add per
// pair of rows.
#define BF16_4X2_K8(wo, xo) \
	VPMOVZXWD wo(R8)(AX*2), Y8; \
	VPSLLD $16, Y8, Y8; \
	VPMOVZXWD wo(R9)(AX*2), Y9; \
	VPSLLD $16, Y9, Y9; \
	VMOVUPS xo(SI)(AX*4), Y10; \
	VMOVUPS xo(DX)(AX*4), Y11; \
	VMOVUPS xo(R12)(AX*4), Y12; \
	VMOVUPS xo(R13)(AX*4), Y13; \
	VFMADD231PS Y10, Y8, Y0; \
	VFMADD231PS Y11, Y8, Y1; \
	VFMADD231PS Y12, Y8, Y2; \
	VFMADD231PS Y13, Y8, Y3; \
	VFMADD231PS Y10, Y9, Y4; \
	VFMADD231PS Y11, Y9, Y5; \
	VFMADD231PS Y12, Y9, Y6; \
	VFMADD231PS Y13, Y9, Y7
