// Every entry point crane wraps, in one list. src/dispatch.rs expands it into
// the ICD dispatch table and clGetExtensionFunctionAddress's answers;
// tests/exports.rs into the names it compares with the exported symbols. The
// file is one macro call: each includer defines `entry_points!` first.
entry_points! {
    clGetPlatformIDs, clGetPlatformInfo, clGetDeviceIDs, clGetDeviceInfo,
    clCreateContext, clCreateContextFromType, clRetainContext, clReleaseContext, clGetContextInfo,
    clCreateCommandQueue, clRetainCommandQueue, clReleaseCommandQueue, clGetCommandQueueInfo, clSetCommandQueueProperty,
    clCreateBuffer, clCreateImage2D, clCreateImage3D, clRetainMemObject, clReleaseMemObject,
    clGetSupportedImageFormats, clGetMemObjectInfo, clGetImageInfo,
    clCreateSampler, clRetainSampler, clReleaseSampler, clGetSamplerInfo,
    clCreateProgramWithSource, clCreateProgramWithBinary, clRetainProgram, clReleaseProgram, clBuildProgram,
    clUnloadCompiler, clGetProgramInfo, clGetProgramBuildInfo,
    clCreateKernel, clCreateKernelsInProgram, clRetainKernel, clReleaseKernel, clSetKernelArg,
    clGetKernelInfo, clGetKernelWorkGroupInfo,
    clWaitForEvents, clGetEventInfo, clRetainEvent, clReleaseEvent, clGetEventProfilingInfo,
    clFlush, clFinish,
    clEnqueueReadBuffer, clEnqueueWriteBuffer, clEnqueueCopyBuffer, clEnqueueReadImage, clEnqueueWriteImage,
    clEnqueueCopyImage, clEnqueueCopyImageToBuffer, clEnqueueCopyBufferToImage, clEnqueueMapBuffer, clEnqueueMapImage,
    clEnqueueUnmapMemObject, clEnqueueNDRangeKernel, clEnqueueTask, clEnqueueNativeKernel,
    clEnqueueMarker, clEnqueueWaitForEvents, clEnqueueBarrier,
    clGetExtensionFunctionAddress,
    // Sharing with OpenGL and EGL (refused, see api/interop.rs)
    clCreateFromGLBuffer, clCreateFromGLTexture2D, clCreateFromGLTexture3D, clCreateFromGLRenderbuffer,
    clGetGLObjectInfo, clGetGLTextureInfo, clEnqueueAcquireGLObjects, clEnqueueReleaseGLObjects,
    clGetGLContextInfoKHR, clCreateEventFromGLsyncKHR, clCreateFromGLTexture,
    clCreateFromEGLImageKHR, clEnqueueAcquireEGLObjectsKHR, clEnqueueReleaseEGLObjectsKHR, clCreateEventFromEGLSyncKHR,
    // cl_ext_device_fission, cl_khr_subgroups
    clCreateSubDevicesEXT, clRetainDeviceEXT, clReleaseDeviceEXT, clGetKernelSubGroupInfoKHR,
    // OpenCL 1.1
    clSetEventCallback, clCreateSubBuffer, clSetMemObjectDestructorCallback, clCreateUserEvent, clSetUserEventStatus,
    clEnqueueReadBufferRect, clEnqueueWriteBufferRect, clEnqueueCopyBufferRect,
    // OpenCL 1.2
    clCreateSubDevices, clRetainDevice, clReleaseDevice, clCreateImage, clCreateProgramWithBuiltInKernels,
    clCompileProgram, clLinkProgram, clUnloadPlatformCompiler, clGetKernelArgInfo,
    clEnqueueFillBuffer, clEnqueueFillImage, clEnqueueMigrateMemObjects,
    clEnqueueMarkerWithWaitList, clEnqueueBarrierWithWaitList, clGetExtensionFunctionAddressForPlatform,
    // OpenCL 2.0
    clCreateCommandQueueWithProperties, clCreatePipe, clGetPipeInfo, clSVMAlloc, clSVMFree,
    clEnqueueSVMFree, clEnqueueSVMMemcpy, clEnqueueSVMMemFill, clEnqueueSVMMap, clEnqueueSVMUnmap,
    clCreateSamplerWithProperties, clSetKernelArgSVMPointer, clSetKernelExecInfo,
    // OpenCL 2.1
    clCloneKernel, clCreateProgramWithIL, clEnqueueSVMMigrateMem, clGetDeviceAndHostTimer, clGetHostTimer,
    clGetKernelSubGroupInfo, clSetDefaultDeviceCommandQueue,
    // OpenCL 2.2
    clSetProgramReleaseCallback, clSetProgramSpecializationConstant,
    // OpenCL 3.0
    clCreateBufferWithProperties, clCreateImageWithProperties, clSetContextDestructorCallback,
}
