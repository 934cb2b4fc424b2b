// The sliding tile attention forward of fastvideo-kernel (csrc/attention/st_attn_h100.cu), bound alone:
// the module fastvideo_kernel._C.fastvideo_kernel_ops with the one function sta_fwd, as the package's
// full build names it, so fastvideo_kernel.sliding_tile_attention finds it.
#include <torch/extension.h>

torch::Tensor sta_forward(torch::Tensor q, torch::Tensor k, torch::Tensor v, torch::Tensor o, int kernel_t_size,
                          int kernel_h_size, int kernel_w_size, int text_length, bool process_text, bool has_text,
                          int kernel_aspect_ratio_flag);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
    m.def("sta_fwd", torch::wrap_pybind_function(sta_forward), "sliding tile attention (Hopper)");
}
