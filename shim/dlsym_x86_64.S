/* SPDX-License-Identifier: Apache-2.0 */
/* The exported dlsym: a trampoline that answers CUDA/NCCL names through cmg_dlsym_answer and
   *jumps* to the real dlsym for every other name, so glibc computes RTLD_NEXT/RTLD_DEFAULT from the
   caller's return address, exactly as without the shim (interposers.md 10.3).
   RTLD_NEXT always jumps, whatever the name: for a caller before the shim glibc's answer is the
   shim's own export (the wrapper), for a caller after it (another interposer preloaded after the
   shim, chaining with dlsym(RTLD_NEXT)) it is the real function; answering relative to the shim
   instead handed such an interposer its own function back, and it called itself until the stack
   ran out (tests/reliability hostile-interposer-after). */

        .text
        .globl  dlsym
        .type   dlsym, @function
        .p2align 4
dlsym:
        .cfi_startproc
        cmpl    $0, cmg_dlsym_ready(%rip)   /* before the shim's constructor (sanitized builds) */
        jne     3f
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp
        .cfi_adjust_cfa_offset 8
        call    cmg_dlsym_early             /* uninstrumented: the real dlsym, resolved */
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testq   %rax, %rax
        jz      3f
        jmp     *%rax
3:
        cmpq    $-1, %rdi                   /* RTLD_NEXT: glibc answers for the caller */
        jne     0f
        movq    cmg_real_dlsym_ptr(%rip), %rax
        testq   %rax, %rax
        jz      0f                          /* not resolved yet: the usual path resolves it */
        jmp     *%rax
0:
        pushq   %rdi
        .cfi_adjust_cfa_offset 8
        pushq   %rsi
        .cfi_adjust_cfa_offset 8
        subq    $8, %rsp                    /* keep the stack 16-byte aligned for the call */
        .cfi_adjust_cfa_offset 8
        call    cmg_dlsym_wanted            /* (handle, name): the arguments are in place */
        addq    $8, %rsp
        .cfi_adjust_cfa_offset -8
        popq    %rsi
        .cfi_adjust_cfa_offset -8
        popq    %rdi
        .cfi_adjust_cfa_offset -8
        testl   %eax, %eax
        jnz     1f
        movq    cmg_real_dlsym_ptr(%rip), %rax
        testq   %rax, %rax
        jz      1f                          /* not resolved yet: let the C side resolve it */
        jmp     *%rax                       /* tail jump: the caller's return address stays */
1:
        movq    (%rsp), %rdx                /* the caller's return address */
        testl   %eax, %eax
        jnz     2f
        /* Rare: the real dlsym is not known yet. Answer through C (it resolves and forwards). */
        jmp     cmg_dlsym_slow
2:
        jmp     cmg_dlsym_answer
        .cfi_endproc
        .size   dlsym, .-dlsym

        .section .note.GNU-stack,"",@progbits
