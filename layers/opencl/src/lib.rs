//! `libkcache_opencl_layer.so`: the two symbols an OpenCL ICD loader looks for in a layer.
//! Everything the layer does is kcache's `backend::opencl::layer`.

mod ffi;
