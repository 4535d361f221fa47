#version 450
// data[i] = data[i] * MUL + add: MUL is a specialization constant, add a push constant.
layout(local_size_x = 64) in;
layout(constant_id = 0) const uint MUL = 1;
layout(push_constant) uniform Push { uint add; } pc;
layout(std430, set = 0, binding = 0) buffer Data { uint v[]; } data;
void main() {
    uint i = gl_GlobalInvocationID.x;
    if (i < data.v.length()) {
        data.v[i] = data.v[i] * MUL + pc.add;
    }
}
