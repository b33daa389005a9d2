"""Facts about the native kernels of mamba-ssm 2.3.2.post1 that the launchers rely on.

For every kernel: where it lives, its full argument list (``arg_names`` of the JIT function, checked at first use),
the autotuner's key, the autotuner's own candidate configurations (``(block kwargs, num_warps, num_stages)``, a copy
of the upstream list, so the fallback rule never depends on a process-global filtering of ``.configs``) and the
arguments its autotuner pre-hook zeroes. Pure data: importing this module imports nothing native.
"""

KERNELS = {
    'chunk_cumsum_fwd': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_state', attr='_chunk_cumsum_fwd_kernel',
        arg_names=tuple(("dt_ptr A_ptr dt_bias_ptr dt_out_ptr dA_cumsum_ptr batch seqlen nheads chunk_size dt_min dt_max"
                         " stride_dt_batch stride_dt_seqlen stride_dt_head stride_A_head stride_dt_bias_head"
                         " stride_dt_out_batch stride_dt_out_chunk stride_dt_out_head stride_dt_out_csize stride_dA_cs_batch"
                         " stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize DT_SOFTPLUS HAS_DT_BIAS BLOCK_SIZE_H"
                         " BLOCK_SIZE_CHUNK").split()),
        autotune_key=('chunk_size', 'nheads'),
        candidates=(
            ({'BLOCK_SIZE_H': 1}, 4, 3),
            ({'BLOCK_SIZE_H': 2}, 4, 3),
            ({'BLOCK_SIZE_H': 4}, 4, 3),
            ({'BLOCK_SIZE_H': 8}, 4, 3),
            ({'BLOCK_SIZE_H': 16}, 4, 3),
            ({'BLOCK_SIZE_H': 32}, 4, 3),
            ({'BLOCK_SIZE_H': 64}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'chunk_cumsum_bwd': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_state', attr='_chunk_cumsum_bwd_kernel',
        arg_names=tuple(("ddA_ptr ddt_out_ptr dt_ptr A_ptr dt_bias_ptr ddt_ptr dA_ptr ddt_bias_ptr batch seqlen nheads"
                         " chunk_size dt_min dt_max stride_ddA_batch stride_ddA_chunk stride_ddA_head stride_ddA_csize"
                         " stride_ddt_out_batch stride_ddt_out_chunk stride_ddt_out_head stride_ddt_out_csize stride_dt_batch"
                         " stride_dt_seqlen stride_dt_head stride_A_head stride_dt_bias_head stride_ddt_batch stride_ddt_seqlen"
                         " stride_ddt_head stride_dA_batch stride_dA_chunk stride_dA_head stride_ddt_bias_batch"
                         " stride_ddt_bias_chunk stride_ddt_bias_head DT_SOFTPLUS HAS_DT_BIAS BLOCK_SIZE_H BLOCK_SIZE_CHUNK"
                         " DETERMINISTIC_REDUCTION").split()),
        autotune_key=('chunk_size', 'nheads'),
        candidates=(
            ({'BLOCK_SIZE_H': 1}, 4, 3),
            ({'BLOCK_SIZE_H': 2}, 4, 3),
            ({'BLOCK_SIZE_H': 4}, 4, 3),
            ({'BLOCK_SIZE_H': 8}, 4, 3),
            ({'BLOCK_SIZE_H': 16}, 4, 3),
            ({'BLOCK_SIZE_H': 32}, 4, 3),
            ({'BLOCK_SIZE_H': 64}, 4, 3),
        ),
        pre_hook_zero=('dA_ptr', 'ddt_bias_ptr'),
    ),
    'bmm_chunk_fwd': dict(
        module='mamba_ssm.ops.triton.ssd_bmm', attr='_bmm_chunk_fwd_kernel',
        arg_names=tuple(("a_ptr b_ptr out_ptr seq_idx_ptr seqlen chunk_size K ngroups stride_a_batch stride_a_seqlen"
                         " stride_a_head stride_ak stride_b_batch stride_b_seqlen stride_b_head stride_bk stride_out_batch"
                         " stride_out_chunk stride_out_head stride_outm stride_outn stride_seq_idx_batch stride_seq_idx_seqlen"
                         " IS_CAUSAL dot_dtype HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K").split()),
        autotune_key=('chunk_size', 'K', 'IS_CAUSAL'),
        candidates=(
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 64}, 8, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 4),
        ),
        pre_hook_zero=(),
    ),
    'bmm_chunk_bwd': dict(
        module='mamba_ssm.ops.triton.ssd_bmm', attr='_bmm_chunk_bwd_kernel',
        arg_names=tuple(("a_ptr dout_ptr db_ptr res_ptr seqlen chunk_size K ngroups stride_a_batch stride_a_seqlen"
                         " stride_a_head stride_ak stride_dout_batch stride_dout_chunk stride_dout_head stride_dout_csize_m"
                         " stride_dout_csize_n stride_db_batch stride_db_seqlen stride_db_head stride_db_k stride_res_batch"
                         " stride_res_seqlen stride_res_head stride_res_k dot_dtype HAS_RESIDUAL BLOCK_SIZE_M BLOCK_SIZE_N"
                         " BLOCK_SIZE_CS").split()),
        autotune_key=('chunk_size', 'K'),
        candidates=(
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_CS': 64}, 8, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_CS': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_CS': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_CS': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_CS': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_CS': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_CS': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_CS': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_CS': 32}, 2, 4),
        ),
        pre_hook_zero=(),
    ),
    'chunk_state_fwd': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_state', attr='_chunk_state_fwd_kernel',
        arg_names=tuple(("x_ptr b_ptr states_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr hdim dstate chunk_size batch seqlen"
                         " nheads_ngroups_ratio stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim stride_b_batch"
                         " stride_b_seqlen stride_b_head stride_b_dstate stride_states_batch stride_states_chunk"
                         " stride_states_head stride_states_hdim stride_states_dstate stride_dt_batch stride_dt_chunk"
                         " stride_dt_head stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head"
                         " stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N"
                         " BLOCK_SIZE_K").split()),
        autotune_key=('hdim', 'dstate', 'chunk_size'),
        candidates=(
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 64}, 8, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 4),
        ),
        pre_hook_zero=(),
    ),
    'chunk_state_bwd_db': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_state', attr='_chunk_state_bwd_db_kernel',
        arg_names=tuple(("x_ptr dstates_ptr b_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr db_ptr ddA_cumsum_ptr chunk_size dstate"
                         " hdim batch seqlen nheads nheads_per_program ngroups stride_x_batch stride_x_seqlen stride_x_head"
                         " stride_x_hdim stride_dstates_batch stride_dstates_chunk stride_states_head stride_states_hdim"
                         " stride_states_dstate stride_b_batch stride_b_seqlen stride_b_head stride_b_dstate stride_dt_batch"
                         " stride_dt_chunk stride_dt_head stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk"
                         " stride_dA_cs_head stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen stride_db_batch"
                         " stride_db_seqlen stride_db_split stride_db_group stride_db_dstate stride_ddA_cs_batch"
                         " stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize stride_ddA_tile HAS_DDA_CS HAS_SEQ_IDX"
                         " DETERMINISTIC_REDUCTION BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K").split()),
        autotune_key=('chunk_size', 'dstate', 'hdim'),
        candidates=(
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 128}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 32}, 4, 3),
        ),
        pre_hook_zero=('ddA_cumsum_ptr',),
    ),
    'state_passing_fwd': dict(
        module='mamba_ssm.ops.triton.ssd_state_passing', attr='_state_passing_fwd_kernel',
        arg_names=tuple(("states_ptr out_ptr final_states_ptr dA_cs_ptr initstates_ptr seq_idx_ptr dim nchunks seqlen"
                         " chunk_size stride_states_batch stride_states_chunk stride_states_head stride_states_dim"
                         " stride_out_batch stride_out_chunk stride_out_head stride_out_dim stride_final_states_batch"
                         " stride_final_states_head stride_final_states_dim stride_dA_cs_batch stride_dA_cs_chunk"
                         " stride_dA_cs_head stride_initstates_batch stride_initstates_head stride_initstates_dim"
                         " stride_seq_idx_batch stride_seq_idx_seqlen HAS_INITSTATES HAS_SEQ_IDX BLOCK_SIZE").split()),
        autotune_key=('dim',),
        candidates=(
            ({'BLOCK_SIZE': 64}, 4, 3),
            ({'BLOCK_SIZE': 128}, 4, 3),
            ({'BLOCK_SIZE': 256}, 4, 3),
            ({'BLOCK_SIZE': 512}, 4, 3),
            ({'BLOCK_SIZE': 1024}, 4, 3),
            ({'BLOCK_SIZE': 2048}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'state_passing_bwd': dict(
        module='mamba_ssm.ops.triton.ssd_state_passing', attr='_state_passing_bwd_kernel',
        arg_names=tuple(("dout_ptr out_ptr dA_cs_ptr dfinal_states_ptr seq_idx_ptr dstates_ptr ddA_cs_ptr dinitstates_ptr"
                         " states_converted_ptr dim nchunks seqlen chunk_size stride_dout_batch stride_dout_chunk"
                         " stride_dout_head stride_dout_dim stride_out_batch stride_out_chunk stride_out_head stride_out_dim"
                         " stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dfinal_states_batch"
                         " stride_dfinal_states_head stride_dfinal_states_dim stride_seq_idx_batch stride_seq_idx_seqlen"
                         " stride_dstates_batch stride_dstates_chunk stride_dstates_head stride_dstates_dim stride_ddA_cs_batch"
                         " stride_ddA_cs_chunk stride_ddA_cs_head stride_dinitstates_batch stride_dinitstates_head"
                         " stride_dinitstates_dim CONVERT_STATES HAS_DFINAL_STATES HAS_DINITSTATES HAS_SEQ_IDX BLOCK_SIZE").split()),
        autotune_key=('dim',),
        candidates=(
            ({'BLOCK_SIZE': 64}, 4, 3),
            ({'BLOCK_SIZE': 128}, 4, 3),
            ({'BLOCK_SIZE': 256}, 4, 3),
            ({'BLOCK_SIZE': 512}, 4, 3),
            ({'BLOCK_SIZE': 1024}, 4, 3),
            ({'BLOCK_SIZE': 2048}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'chunk_scan_fwd': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_scan', attr='_chunk_scan_fwd_kernel',
        arg_names=tuple(("cb_ptr x_ptr z_ptr out_ptr out_x_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr C_ptr prev_states_ptr D_ptr"
                         " chunk_size hdim dstate batch seqlen nheads_ngroups_ratio stride_cb_batch stride_cb_chunk"
                         " stride_cb_head stride_cb_csize_m stride_cb_csize_k stride_x_batch stride_x_seqlen stride_x_head"
                         " stride_x_hdim stride_z_batch stride_z_seqlen stride_z_head stride_z_hdim stride_out_batch"
                         " stride_out_seqlen stride_out_head stride_out_hdim stride_dt_batch stride_dt_chunk stride_dt_head"
                         " stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize"
                         " stride_seq_idx_batch stride_seq_idx_seqlen stride_C_batch stride_C_seqlen stride_C_head"
                         " stride_C_dstate stride_states_batch stride_states_chunk stride_states_head stride_states_hdim"
                         " stride_states_dstate stride_D_head IS_CAUSAL HAS_D D_HAS_HDIM HAS_Z HAS_SEQ_IDX BLOCK_SIZE_M"
                         " BLOCK_SIZE_N BLOCK_SIZE_K BLOCK_SIZE_DSTATE IS_TRITON_22").split()),
        autotune_key=('chunk_size', 'hdim', 'dstate', 'IS_CAUSAL'),
        candidates=(
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 64}, 8, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 64}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 64}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 4),
        ),
        pre_hook_zero=(),
    ),
    'chunk_scan_bwd_dz': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_scan', attr='_chunk_scan_bwd_dz_kernel',
        arg_names=tuple(("dout_ptr out_ptr z_ptr x_ptr D_ptr outz_ptr dz_ptr dout_x_ptr dD_ptr ddA_cumsum_ptr chunk_size hdim"
                         " batch seqlen stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim stride_out_batch"
                         " stride_out_seqlen stride_out_head stride_out_hdim stride_z_batch stride_z_seqlen stride_z_head"
                         " stride_z_hdim stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim stride_D_head"
                         " stride_outz_batch stride_outz_seqlen stride_outz_head stride_outz_hdim stride_dz_batch"
                         " stride_dz_seqlen stride_dz_head stride_dz_hdim stride_doutx_batch stride_doutx_seqlen"
                         " stride_doutx_head stride_doutx_hdim stride_dD_batch stride_dD_chunk stride_dD_head stride_dD_csize"
                         " stride_dD_hdim stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize HAS_D"
                         " D_HAS_HDIM HAS_DDACS RECOMPUTE_OUTPUT BLOCK_SIZE_M BLOCK_SIZE_N").split()),
        autotune_key=('chunk_size', 'hdim'),
        candidates=(
            ({'BLOCK_SIZE_M': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 128}, 4, 3),
            ({'BLOCK_SIZE_M': 256}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'chunk_scan_bwd_dstates': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_scan', attr='_chunk_scan_bwd_dstates_kernel',
        arg_names=tuple(("dout_ptr c_ptr dprev_states_ptr dA_cumsum_ptr seq_idx_ptr hdim dstate chunk_size batch seqlen"
                         " nchunks nheads_ngroups_ratio stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim"
                         " stride_c_batch stride_c_seqlen stride_c_head stride_c_dstate stride_dprev_states_batch"
                         " stride_dprev_states_chunk stride_dprev_states_head stride_dprev_states_hdim"
                         " stride_dprev_states_dstate stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head"
                         " stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N"
                         " BLOCK_SIZE_K").split()),
        autotune_key=('hdim', 'dstate', 'chunk_size'),
        candidates=(
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 64}, 8, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 5),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 2, 4),
        ),
        pre_hook_zero=(),
    ),
    'chunk_scan_bwd_dC': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_scan', attr='_chunk_scan_bwd_dc_kernel',
        arg_names=tuple(("dout_ptr prev_states_ptr C_ptr dA_cumsum_ptr seq_idx_ptr dc_ptr ddA_cumsum_ptr chunk_size dstate"
                         " hdim batch seqlen nheads nheads_per_program ngroups stride_dout_batch stride_dout_seqlen"
                         " stride_dout_head stride_dout_hdim stride_prev_states_batch stride_prev_states_chunk"
                         " stride_prev_states_head stride_prev_states_hdim stride_prev_states_dstate stride_C_batch"
                         " stride_C_seqlen stride_C_head stride_C_dstate stride_dA_cs_batch stride_dA_cs_chunk"
                         " stride_dA_cs_head stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen stride_dc_batch"
                         " stride_dc_seqlen stride_dc_split stride_dc_group stride_dc_dstate stride_ddA_cs_batch"
                         " stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize stride_ddA_tile HAS_DDA_CS HAS_SEQ_IDX"
                         " DETERMINISTIC_REDUCTION BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K").split()),
        autotune_key=('chunk_size', 'dstate', 'hdim'),
        candidates=(
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 128}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 32}, 4, 3),
        ),
        pre_hook_zero=('ddA_cumsum_ptr',),
    ),
    'chunk_scan_bwd_dcb': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_scan', attr='_chunk_scan_bwd_dcb_kernel',
        arg_names=tuple(("x_ptr dout_ptr cb_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr dcb_ptr ddA_cumsum_ptr chunk_size hdim batch"
                         " seqlen nheads nheads_per_program ngroups stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim"
                         " stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim stride_cb_batch"
                         " stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_n stride_dt_batch stride_dt_chunk"
                         " stride_dt_head stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head"
                         " stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen stride_dcb_batch stride_dcb_chunk"
                         " stride_dcb_split stride_dcb_group stride_dcb_csize_m stride_dcb_csize_n stride_ddA_cs_batch"
                         " stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize_m stride_ddA_cs_csize_n HAS_DDA_CS"
                         " HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K").split()),
        autotune_key=('chunk_size', 'hdim'),
        candidates=(
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 128}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 32}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'chunk_scan_bwd_ddAcs_stable': dict(
        module='mamba_ssm.ops.triton.ssd_chunk_scan', attr='_chunk_scan_bwd_ddAcs_stable_kernel',
        arg_names=tuple(("x_ptr dout_ptr dt_ptr dA_cumsum_ptr cb_ptr ddA_cumsum_ptr chunk_size hdim batch seqlen"
                         " nheads_ngroups_ratio stride_x_batch stride_x_seqlen stride_x_head stride_x_hdim stride_dout_batch"
                         " stride_dout_seqlen stride_dout_head stride_dout_hdim stride_dt_batch stride_dt_chunk stride_dt_head"
                         " stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk stride_dA_cs_head stride_dA_cs_csize"
                         " stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m stride_cb_csize_n"
                         " stride_ddA_cs_batch stride_ddA_cs_chunk stride_ddA_cs_head stride_ddA_cs_csize_m"
                         " stride_ddA_cs_csize_n BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K").split()),
        autotune_key=('chunk_size', 'hdim'),
        candidates=(
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64}, 4, 3),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 128}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'chunk_scan_chunk_state_bwd_dx': dict(
        module='mamba_ssm.ops.triton.ssd_combined', attr='_chunk_scan_chunk_state_bwd_dx_kernel',
        arg_names=tuple(("x_ptr cb_ptr dout_ptr dt_ptr dA_cumsum_ptr seq_idx_ptr D_ptr b_ptr dstates_ptr dx_ptr ddt_ptr dD_ptr"
                         " chunk_size hdim dstate batch seqlen nheads_ngroups_ratio stride_x_batch stride_x_seqlen"
                         " stride_x_head stride_x_hdim stride_cb_batch stride_cb_chunk stride_cb_head stride_cb_csize_m"
                         " stride_cb_csize_k stride_dout_batch stride_dout_seqlen stride_dout_head stride_dout_hdim"
                         " stride_dt_batch stride_dt_chunk stride_dt_head stride_dt_csize stride_dA_cs_batch stride_dA_cs_chunk"
                         " stride_dA_cs_head stride_dA_cs_csize stride_seq_idx_batch stride_seq_idx_seqlen stride_D_head"
                         " stride_b_batch stride_b_seqlen stride_b_head stride_b_dstate stride_dstates_batch"
                         " stride_dstates_chunk stride_dstates_head stride_dstates_hdim stride_dstates_dstate stride_dx_batch"
                         " stride_dx_seqlen stride_dx_head stride_dx_hdim stride_ddt_batch stride_ddt_chunk stride_ddt_head"
                         " stride_ddt_csize stride_ddt_tile stride_dD_batch stride_dD_chunk stride_dD_head stride_dD_csize"
                         " stride_dD_hdim HAS_D D_HAS_HDIM HAS_SEQ_IDX BLOCK_SIZE_M BLOCK_SIZE_N BLOCK_SIZE_K BLOCK_SIZE_DSTATE"
                         " IS_TRITON_22 DETERMINISTIC_REDUCTION").split()),
        autotune_key=('chunk_size', 'hdim', 'dstate'),
        candidates=(
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 64}, 8, 3),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 256, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 128, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 128, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 4, 4),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 32, 'BLOCK_SIZE_K': 32}, 4, 5),
            ({'BLOCK_SIZE_M': 32, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 4, 5),
            ({'BLOCK_SIZE_M': 64, 'BLOCK_SIZE_N': 64, 'BLOCK_SIZE_K': 32}, 4, 4),
        ),
        pre_hook_zero=('ddt_ptr', 'dD_ptr'),
    ),
    'swiglu_fwd': dict(
        module='mamba_ssm.ops.triton.k_activations', attr='_swiglu_fwd_kernel',
        arg_names=tuple(("X Y OUT stride_x_row stride_y_row stride_out_row ncols BLOCK_N").split()),
        autotune_key=('ncols',),
        candidates=(
            ({'BLOCK_N': 32}, 4, 3),
            ({'BLOCK_N': 64}, 4, 3),
            ({'BLOCK_N': 128}, 4, 3),
            ({'BLOCK_N': 256}, 4, 3),
            ({'BLOCK_N': 512}, 4, 3),
            ({'BLOCK_N': 1024}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'swiglu_bwd': dict(
        module='mamba_ssm.ops.triton.k_activations', attr='_swiglu_bwd_kernel',
        arg_names=tuple(("X Y DOUT OUT DX DY stride_x_row stride_y_row stride_dout_row stride_out_row stride_dx_row"
                         " stride_dy_row ncols BLOCK_N RECOMPUTE_OUTPUT").split()),
        autotune_key=('ncols',),
        candidates=(
            ({'BLOCK_N': 32}, 4, 3),
            ({'BLOCK_N': 64}, 4, 3),
            ({'BLOCK_N': 128}, 4, 3),
            ({'BLOCK_N': 256}, 4, 3),
            ({'BLOCK_N': 512}, 4, 3),
            ({'BLOCK_N': 1024}, 4, 3),
        ),
        pre_hook_zero=(),
    ),
    'rmsnorm_gated_fwd': dict(
        module='mamba_ssm.ops.triton.layernorm_gated', attr='_layer_norm_fwd_1pass_kernel',
        arg_names=tuple(("X Y W B Z Mean Rstd stride_x_row stride_y_row stride_z_row M N eps BLOCK_N HAS_BIAS HAS_Z"
                         " NORM_BEFORE_GATE IS_RMS_NORM").split()),
        autotune_key=None,
        candidates=None,
        pre_hook_zero=(),
    ),
    'rmsnorm_gated_bwd': dict(
        module='mamba_ssm.ops.triton.layernorm_gated', attr='_layer_norm_bwd_kernel',
        arg_names=tuple(("X W B Z Y DY DX DW DB DZ Mean Rstd stride_x_row stride_z_row stride_y_row stride_dy_row"
                         " stride_dx_row stride_dz_row stride_dw_row stride_db_row M N eps rows_per_program NORM_BEFORE_GATE"
                         " IS_RMS_NORM HAS_BIAS HAS_Z RECOMPUTE_OUTPUT BLOCK_N").split()),
        autotune_key=None,
        candidates=None,
        pre_hook_zero=(),
    ),
}
