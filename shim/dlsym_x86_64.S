/* SPDX-License-Identifier: Apache-2.0 */
/* The exported dlsym: a trampoline that answers CUDA/NCCL names through cmg_dlsym_answer and
   *jumps* to the real dlsym for every other name, so glibc computes RTLD_NEXT/RTLD_DEFAULT from the
   caller's return address, exactly as without the shim (interposers.md 10.3). */

        .text
        .globl  dlsym
        .type   dlsym, @function
        .p2align 4
dlsym:
        .cfi_startproc
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
